"""Creating, deleting and reading a whole cluster's metadata (``ZooKeeperCli create/delete/list``).

Creation follows zktools ``CreateCluster`` + ``ClusterManagerImpl.createZNodes`` and
``StoreMetadata.create`` step by step, so even znode versions and child versions match what
the Java tool leaves behind (vector moment ``a``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError

from waltz_engine.zk.java_io import INT32_MAX
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import (
    ClusterParams,
    ConnectionMetadata,
    GroupDescriptor,
    IdCounter,
    PartitionAssignment,
    PartitionMetadata,
    ReplicaAssignments,
    ServerDescriptor,
    StoreParams,
)
from waltz_engine.zk.store_metadata import init_store
from waltz_engine.zk.znodes import (
    ClusterExistsError,
    ClusterMetadataError,
    ClusterNotFoundError,
    create_ancestors,
    read_optional,
    read_required,
    write,
)

T = TypeVar("T")


class ClusterNameMismatchError(ClusterMetadataError):
    """delete was given a name that is not the stored cluster's."""


def create_cluster(
    client: KazooClient, root: str, name: str, num_partitions: int, key: uuid.UUID | None = None
) -> StoreParams:
    """Write a new cluster's znodes; refuses if anything exists at ``root``. Returns the store params."""
    if not 0 <= num_partitions <= INT32_MAX:
        raise ClusterMetadataError("Number of partitions must be a non-negative integer")
    paths = ClusterPaths.of(root)
    params = ClusterParams(name, num_partitions).to_bytes()  # encodes before anything is written
    if client.exists(paths.root) is not None:
        raise ClusterExistsError(f"Cluster already exists at {paths.root}. Aborting.")
    create_ancestors(client, paths.root)
    try:
        client.create(paths.root, None)
    except NodeExistsError:
        raise ClusterExistsError(f"Cluster already exists at {paths.root}. Aborting.") from None
    write(client, paths.root, params, expected_version=0)  # CreateCluster: create empty, then set
    client.create(paths.server_descriptors, PartitionAssignment.initial().to_bytes())
    client.create(paths.ids, None)
    client.create(paths.client_ids, IdCounter(0).to_bytes())
    client.create(paths.server_ids, IdCounter(0).to_bytes())
    return init_store(client, paths, num_partitions, key if key is not None else uuid.uuid4())


def delete_cluster(client: KazooClient, root: str, name: str, force: bool = False) -> None:
    """Recursively delete a cluster, only if its stored name is ``name`` (or ``force``)."""
    paths = ClusterPaths.of(root)
    found = read_optional(client, paths.root, ClusterParams.from_bytes)
    if found is None:
        raise ClusterNotFoundError(f"cluster root [{paths.root}] does not exist")
    params, _ = found
    if not force:
        if params is None:
            raise ClusterNameMismatchError(
                f"cluster root [{paths.root}] holds no cluster parameters; use --force to delete it anyway"
            )
        if params.name != name:
            raise ClusterNameMismatchError(
                f"specified cluster name [{name}] does not match zookeeper value [{params.name}]"
            )
    client.delete(paths.root, recursive=True)


def read_cluster_params(client: KazooClient, root: str) -> ClusterParams:
    paths = ClusterPaths.of(root)
    found = read_optional(client, paths.root, ClusterParams.from_bytes)
    if found is None:
        raise ClusterNotFoundError(f"cluster root [{paths.root}] does not exist")
    if found[0] is None:
        raise ClusterNotFoundError(f"cluster root [{paths.root}] holds no cluster parameters")
    return found[0]


def read_partition_assignment(client: KazooClient, root: str) -> PartitionAssignment:
    value, _ = read_required(client, ClusterPaths.of(root).server_descriptors, PartitionAssignment.from_bytes)
    return value


def read_server_descriptors(client: KazooClient, root: str) -> tuple[ServerDescriptor, ...]:
    """Live servers (ephemeral ``s_`` znodes), by server id."""
    paths = ClusterPaths.of(root)
    descriptors = []
    for child in client.get_children(paths.server_descriptors):
        path = f"{paths.server_descriptors}/{child}"
        if paths.kind_of(path) != "ServerDescriptor":
            continue
        found = read_optional(client, path, ServerDescriptor.from_bytes)
        if found is not None and found[0] is not None:  # a server may vanish while we list
            descriptors.append(found[0])
    return tuple(sorted(descriptors, key=lambda d: d.server_id))


def _next_id(client: KazooClient, path: str) -> int:
    """zktools ``nextId``: increment the counter with CAS, retrying when another process won."""
    while True:
        counter, version = read_required(client, path, IdCounter.from_bytes)
        assert counter.value < INT32_MAX, f"id counter {path} is exhausted"
        try:
            client.set(path, IdCounter(counter.value + 1).to_bytes(), version=version)
        except BadVersionError:
            continue
        return counter.value + 1


def next_client_id(client: KazooClient, root: str) -> int:
    return _next_id(client, ClusterPaths.of(root).client_ids)


def next_server_id(client: KazooClient, root: str) -> int:
    return _next_id(client, ClusterPaths.of(root).server_ids)


class ClusterSnapshot(NamedTuple):
    """Everything ``ZooKeeperCli list`` shows; None where a znode is missing."""

    root: str
    cluster: ClusterParams
    servers: tuple[ServerDescriptor, ...]
    assignment: PartitionAssignment | None
    store: StoreParams | None
    replicas: ReplicaAssignments | None
    groups: GroupDescriptor | None
    connections: ConnectionMetadata | None
    partitions: tuple[tuple[int, PartitionMetadata | None], ...]  # None: no znode for that partition


def _value(client: KazooClient, path: str, decode: Callable[[bytes], T]) -> T | None:
    found = read_optional(client, path, decode)
    return found[0] if found is not None else None


def read_snapshot(client: KazooClient, root: str) -> ClusterSnapshot:
    paths = ClusterPaths.of(root)
    cluster = read_cluster_params(client, root)
    store = _value(client, paths.store, StoreParams.from_bytes)
    partitions = tuple(
        (partition_id, _value(client, paths.partition(partition_id), PartitionMetadata.from_bytes))
        for partition_id in range(store.num_partitions if store is not None else 0)
    )
    has_servers = client.exists(paths.server_descriptors) is not None
    return ClusterSnapshot(
        root=paths.root,
        cluster=cluster,
        servers=read_server_descriptors(client, root) if has_servers else (),
        assignment=_value(client, paths.server_descriptors, PartitionAssignment.from_bytes),
        store=store,
        replicas=_value(client, paths.assignment, ReplicaAssignments.from_bytes),
        groups=_value(client, paths.group, GroupDescriptor.from_bytes),
        connections=_value(client, paths.connection, ConnectionMetadata.from_bytes),
        partitions=partitions,
    )
