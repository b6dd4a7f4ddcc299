"""Store metadata under ``<root>/store``: storage nodes, groups, replica assignments, partitions.

A port of ``CM/metadata/StoreMetadata.java``: every change reads, checks and writes under the
admin lock with CAS on the versions read, and builds its maps the same way the original does
(copy, put, copy again) so the bytes — including ``HashMap`` entry order — are identical.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from waltz_engine.common.address import MAX_PORT, is_port, parse_host_port
from waltz_engine.zk.admin_lock import admin_lock
from waltz_engine.zk.java_io import INT32_MAX, JavaHashMap, java_string_hash
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import (
    ConnectionMetadata,
    GroupDescriptor,
    PartitionMetadata,
    ReplicaAssignments,
    StoreParams,
    storage_map,
)
from waltz_engine.zk.znodes import (
    NO_VERSION,
    ClusterMetadataError,
    ConcurrentUpdateError,
    read_optional,
    read_required,
    write,
)


class StoreMetadataError(ClusterMetadataError):
    """A store-metadata change breaks one of the original's rules (duplicate node, bad partition...)."""


class VersionedPartitionMetadata(NamedTuple):
    metadata: PartitionMetadata
    version: int  # the znode version to CAS against; NO_VERSION when the znode does not exist yet


# --- reads -----------------------------------------------------------------------------------


def read_store_params(client: KazooClient, root: str) -> StoreParams:
    """The cluster key and partition count every storage node and server checks against."""
    value, _ = read_required(client, ClusterPaths.of(root).store, StoreParams.from_bytes)
    return value


def read_replica_assignments(client: KazooClient, root: str) -> ReplicaAssignments:
    value, _ = read_required(client, ClusterPaths.of(root).assignment, ReplicaAssignments.from_bytes)
    return value


def read_group_descriptor(client: KazooClient, root: str) -> GroupDescriptor:
    value, _ = read_required(client, ClusterPaths.of(root).group, GroupDescriptor.from_bytes)
    return value


def read_connection_metadata(client: KazooClient, root: str) -> ConnectionMetadata:
    value, _ = read_required(client, ClusterPaths.of(root).connection, ConnectionMetadata.from_bytes)
    return value


def read_partition_metadata(client: KazooClient, root: str, partition_id: int) -> VersionedPartitionMetadata:
    """A partition's metadata; a partition without a znode (or data) reads as ``EMPTY``."""
    found = read_optional(client, ClusterPaths.of(root).partition(partition_id), PartitionMetadata.from_bytes)
    if found is None:
        return VersionedPartitionMetadata(PartitionMetadata.empty(), NO_VERSION)
    value, version = found
    return VersionedPartitionMetadata(value if value is not None else PartitionMetadata.empty(), version)


def write_partition_metadata(
    client: KazooClient, root: str, partition_id: int, metadata: PartitionMetadata, expected_version: int
) -> int:
    """Compare-and-set a partition's metadata; returns the new znode version.

    ``expected_version`` is the version :func:`read_partition_metadata` returned; ``NO_VERSION``
    means "the znode must not exist yet" and creates it. Losing the race raises
    :class:`ConcurrentUpdateError`, which is how a stale server gets fenced off.
    """
    path = ClusterPaths.of(root).partition(partition_id)
    if expected_version == NO_VERSION:
        try:
            client.create(path, metadata.to_bytes())
        except NodeExistsError:
            raise ConcurrentUpdateError(f"znode {path} was created by someone else; re-read it") from None
        return 0
    return write(client, path, metadata.to_bytes(), expected_version)


def issue_store_sessions(client: KazooClient, root: str, num_partitions: int, session_id: int) -> None:
    """Record ``session_id`` as every partition's store session, as a server's compare-and-set
    does. For a storage node used without a server (benchmarks, tests): a node accepts only
    session ids that ZooKeeper has issued."""
    for partition_id in range(num_partitions):
        metadata, version = read_partition_metadata(client, root, partition_id)
        if metadata.session_id < session_id:
            issued = metadata._replace(session_id=session_id)
            write_partition_metadata(client, root, partition_id, issued, version)


# --- creation --------------------------------------------------------------------------------


def init_store(client: KazooClient, paths: ClusterPaths, num_partitions: int, key: uuid.UUID) -> StoreParams:
    """``StoreMetadata.create`` with no storage nodes: the znodes under ``store`` and their
    initial payloads, each set under its own hold of the admin lock as the original does."""
    for path in (paths.store, paths.partitions, paths.group, paths.assignment, paths.connection):
        client.create(path, None)
    params = StoreParams(key, num_partitions)
    empty: JavaHashMap[str, int] = storage_map(())
    empty_replicas: JavaHashMap[str, tuple[int, ...]] = storage_map(())
    initial = (
        (paths.store, params.to_bytes()),
        (paths.group, GroupDescriptor.of_map(empty).to_bytes()),
        (paths.assignment, ReplicaAssignments.of_map(empty_replicas).to_bytes()),
        (paths.connection, ConnectionMetadata.of_map(empty).to_bytes()),
    )
    for path, data in initial:
        with admin_lock(client, paths):
            found = read_optional(client, path, bytes)
            if found is not None and found[0] is not None:
                raise StoreMetadataError(f"znode {path} has already been set")
            write(client, path, data, NO_VERSION)
    return params


# --- storage nodes ---------------------------------------------------------------------------


class _StorageMaps(NamedTuple):
    groups: JavaHashMap[str, int]
    group_version: int
    replicas: JavaHashMap[str, tuple[int, ...]]
    replica_version: int
    connections: JavaHashMap[str, int]
    connection_version: int


def _read_storage_maps(client: KazooClient, paths: ClusterPaths) -> _StorageMaps:
    groups, group_version = read_required(client, paths.group, GroupDescriptor.from_bytes)
    replicas, replica_version = read_required(client, paths.assignment, ReplicaAssignments.from_bytes)
    connections, connection_version = read_required(client, paths.connection, ConnectionMetadata.from_bytes)
    return _StorageMaps(
        groups.as_map(),
        group_version,
        replicas.as_map(),
        replica_version,
        connections.as_map(),
        connection_version,
    )


def add_storage_node(client: KazooClient, root: str, storage: str, group_id: int, admin_port: int) -> None:
    """Put a storage node (data ``host:port``) in a group, with no partitions and its admin port."""
    parse_host_port(storage)
    if not is_port(admin_port):
        raise StoreMetadataError(f"storage admin port must be in 1..{MAX_PORT}, got {admin_port}")
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        maps = _read_storage_maps(client, paths)
        if storage in maps.groups or storage in maps.replicas or storage in maps.connections:
            raise StoreMetadataError(f"Storage node already exists: {storage}")
        groups = JavaHashMap.copy_of(maps.groups)
        groups.put(storage, group_id)
        replicas = JavaHashMap.copy_of(maps.replicas)
        replicas.put(storage, ())
        connections = JavaHashMap.copy_of(maps.connections)
        connections.put(storage, admin_port)
        write(client, paths.group, GroupDescriptor.of_map(groups).to_bytes(), maps.group_version)
        write(client, paths.assignment, ReplicaAssignments.of_map(replicas).to_bytes(), maps.replica_version)
        write(
            client,
            paths.connection,
            ConnectionMetadata.of_map(connections).to_bytes(),
            maps.connection_version,
        )


def remove_storage_node(client: KazooClient, root: str, storage: str) -> None:
    """Forget a storage node; refused while it still holds partitions."""
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        maps = _read_storage_maps(client, paths)
        if storage not in maps.groups and storage not in maps.replicas and storage not in maps.connections:
            raise StoreMetadataError(f"Storage node does not exist: {storage}")
        if maps.replicas.get(storage):
            raise StoreMetadataError(f"Storage node {storage} cannot be removed when containing partitions")
        replicas = JavaHashMap.copy_of(maps.replicas)
        replicas.remove(storage)
        groups = JavaHashMap.copy_of(maps.groups)
        groups.remove(storage)
        connections = JavaHashMap.copy_of(maps.connections)
        connections.remove(storage)
        write(client, paths.assignment, ReplicaAssignments.of_map(replicas).to_bytes(), maps.replica_version)
        write(client, paths.group, GroupDescriptor.of_map(groups).to_bytes(), maps.group_version)
        write(
            client,
            paths.connection,
            ConnectionMetadata.of_map(connections).to_bytes(),
            maps.connection_version,
        )


# --- partitions ------------------------------------------------------------------------------


def _checked_partitions(partitions: Sequence[int]) -> list[int]:
    if not partitions:
        raise StoreMetadataError("Partitions list is empty")
    return sorted(set(partitions))


def assign_partitions(client: KazooClient, root: str, storage: str, partitions: Sequence[int]) -> None:
    """Give a storage node more partitions (stored sorted).

    The original only refuses when *every* partition is already there; we refuse when *any*
    is, since a partly duplicated request is almost certainly a mistake.
    """
    wanted = _checked_partitions(partitions)
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        params, _ = read_required(client, paths.store, StoreParams.from_bytes)
        assignments, version = read_required(client, paths.assignment, ReplicaAssignments.from_bytes)
        if wanted[0] < 0 or wanted[-1] >= params.num_partitions:
            raise StoreMetadataError(
                f"One or more partition(s) in [{wanted[0]}, {wanted[-1]}] does not belong to the cluster "
                f"(partitions are 0..{params.num_partitions - 1})"
            )
        replicas = assignments.as_map()
        current = replicas.get(storage)
        if current is None:
            raise StoreMetadataError(f"Storage node does not exist: {storage}")
        duplicates = [p for p in wanted if p in current]
        if duplicates:
            raise StoreMetadataError(
                f"Partition {duplicates[0]} already exists in the storage node {storage}."
            )
        updated = JavaHashMap.copy_of(replicas)
        updated.put(storage, tuple(sorted(set(current) | set(wanted))))
        write(client, paths.assignment, ReplicaAssignments.of_map(updated).to_bytes(), version)


def unassign_partitions(client: KazooClient, root: str, storage: str, partitions: Sequence[int]) -> None:
    """Take partitions off a storage node; its group must keep another copy of each."""
    unwanted = _checked_partitions(partitions)
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        assignments, version = read_required(client, paths.assignment, ReplicaAssignments.from_bytes)
        descriptor, _ = read_required(client, paths.group, GroupDescriptor.from_bytes)
        groups = descriptor.as_map()
        group_id = groups.get(storage)
        if group_id is None:
            raise StoreMetadataError(f"Storage node {storage} is not part of any of the storage groups")
        replicas = assignments.as_map()
        current = replicas.get(storage)
        if current is None:
            raise StoreMetadataError(f"Storage node does not exist: {storage}")
        for partition_id in unwanted:
            if partition_id not in current:
                raise StoreMetadataError(
                    f"Partition {partition_id} does not exist in the storage node {storage}."
                )
        updated = JavaHashMap.copy_of(replicas)
        updated.put(storage, tuple(sorted(set(current) - set(unwanted))))
        for partition_id in unwanted:
            holders = (
                other
                for other, other_group in groups.items()
                if other_group == group_id and partition_id in (updated.get(other) or ())
            )
            if next(holders, None) is None:
                raise StoreMetadataError(
                    f"Storage group does not contain full partitions after removing {partition_id}"
                )
        write(client, paths.assignment, ReplicaAssignments.of_map(updated).to_bytes(), version)


def change_replicas(
    client: KazooClient,
    root: str,
    adds: Sequence[tuple[str, int]] = (),
    removes: Sequence[tuple[str, int]] = (),
) -> None:
    """Give and take (storage, partition) pairs in one assignment write: every server reopens
    the sessions of what changed once, not once per pair. Adding a pair already there or
    removing one that is not is a no-op, so a change that was cut short can simply be redone."""
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        assignments, version = read_required(client, paths.assignment, ReplicaAssignments.from_bytes)
        replicas = assignments.as_map()
        updated = JavaHashMap.copy_of(replicas)
        changed = False
        for storage in sorted({s for s, _ in (*adds, *removes)}):
            current = replicas.get(storage)
            if current is None:
                raise StoreMetadataError(f"Storage node does not exist: {storage}")
            given = {p for s, p in adds if s == storage}
            taken = {p for s, p in removes if s == storage}
            held = (set(current) | given) - taken
            if held != set(current):
                updated.put(storage, tuple(sorted(held)))
                changed = True
        if changed:
            write(client, paths.assignment, ReplicaAssignments.of_map(updated).to_bytes(), version)


def auto_assign(client: KazooClient, root: str, group_id: int) -> None:
    """Spread all partitions round-robin over the (still empty) storage nodes of a group."""
    paths = ClusterPaths.of(root)
    with admin_lock(client, paths):
        params, _ = read_required(client, paths.store, StoreParams.from_bytes)
        assignments, version = read_required(client, paths.assignment, ReplicaAssignments.from_bytes)
        descriptor, _ = read_required(client, paths.group, GroupDescriptor.from_bytes)
        # Collectors.toSet() is a HashSet: the nodes are visited in its order, not the group map's.
        members: JavaHashMap[str, None] = JavaHashMap.from_items(
            java_string_hash, ((s, None) for s, g in descriptor.as_map().items() if g == group_id)
        )
        if len(members) == 0:
            raise StoreMetadataError(f"No storage node found in group {group_id}.")
        nodes = list(members.keys())
        replicas = assignments.as_map()
        if any(replicas.get(storage) for storage in nodes):
            raise StoreMetadataError(f"Found storage node with assignment in group {group_id}.")
        updated = JavaHashMap.copy_of(replicas)
        lists = _round_robin(params.num_partitions, len(nodes))
        for storage, partition_ids in zip(nodes, lists, strict=True):
            updated.put(storage, partition_ids)
        write(client, paths.assignment, ReplicaAssignments.of_map(updated).to_bytes(), version)


def _round_robin(num_partitions: int, num_nodes: int) -> list[tuple[int, ...]]:
    """The original's queue rotation: the lists come out rotated by ``num_partitions % num_nodes``."""
    assert 0 <= num_partitions <= INT32_MAX and num_nodes > 0
    queue: deque[list[int]] = deque([] for _ in range(num_nodes))
    for partition_id in range(num_partitions):
        bucket = queue.popleft()
        bucket.append(partition_id)
        queue.append(bucket)
    return [tuple(bucket) for bucket in queue]
