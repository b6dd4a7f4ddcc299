"""Cluster metadata on a real ZooKeeper: byte-identical to the Java tools, CAS, the admin lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from testkit import read_jsonl

from waltz_engine.common.address import AddressError
from waltz_engine.zk import store_metadata
from waltz_engine.zk.admin_lock import AdminLockTimeoutError, admin_lock
from waltz_engine.zk.cluster import (
    ClusterNameMismatchError,
    create_cluster,
    delete_cluster,
    next_client_id,
    next_server_id,
    read_cluster_params,
    read_snapshot,
)
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import PartitionMetadata, ReplicaId, ReplicaState
from waltz_engine.zk.store_metadata import StoreMetadataError
from waltz_engine.zk.znode_dump import dump_znodes
from waltz_engine.zk.znodes import NO_VERSION, ClusterExistsError, ClusterNotFoundError, ConcurrentUpdateError

VECTOR_ROOT = "/vectors"
STORE_KEY_HEX = slice(2, 34)  # the 16 key bytes of StoreParams, after the version byte
COMPARED = ("hex", "data_null", "ephemeral", "version", "cversion", "numChildren", "kind", "decoded")
STORAGE_PORTS = (57280, 57290, 57300)


def _moment(vectors: Path, moment: str) -> dict[str, dict[str, Any]]:
    records = read_jsonl(vectors / "zk" / "znodes.jsonl")
    return {r["path"][len(VECTOR_ROOT) :]: r for r in records if r["moment"] == moment}


def _ours(client: KazooClient, root: str) -> dict[str, dict[str, Any]]:
    return {r.path[len(root) :]: r.to_json() for r in dump_znodes(client, root)}


def _without_key(record: dict[str, Any]) -> dict[str, Any]:
    compared: dict[str, Any] = {field: record.get(field) for field in COMPARED}
    compared["data_null"] = record.get("data_null", False)  # the vectors only say so when true
    if record.get("kind") == "StoreParams":
        hex_data = compared["hex"]
        compared["hex"] = hex_data[: STORE_KEY_HEX.start] + hex_data[STORE_KEY_HEX.stop :]
        compared["decoded"] = {**compared["decoded"], "key": None}
    return compared


def _assert_same_znodes(ours: dict[str, dict[str, Any]], java: dict[str, dict[str, Any]]) -> None:
    assert sorted(ours) == sorted(java)
    for path, record in java.items():
        assert _without_key(ours[path]) == _without_key(record), path


def test_create_and_storage_setup_match_vector_moments_a_and_b(
    zk_client: KazooClient, cluster_root: str, vectors: Path
) -> None:
    params = create_cluster(zk_client, cluster_root, "vectors", 4)
    _assert_same_znodes(_ours(zk_client, cluster_root), _moment(vectors, "a"))
    assert store_metadata.read_store_params(zk_client, cluster_root) == params

    for port in STORAGE_PORTS:
        storage = f"localhost:{port}"
        store_metadata.add_storage_node(zk_client, cluster_root, storage, 0, port + 1)
        store_metadata.assign_partitions(zk_client, cluster_root, storage, [0, 1, 2, 3])
    _assert_same_znodes(_ours(zk_client, cluster_root), _moment(vectors, "b"))


def test_create_refuses_an_existing_root(zk_client: KazooClient, cluster_root: str) -> None:
    zk_client.create(cluster_root, b"", makepath=True)
    with pytest.raises(ClusterExistsError, match="already exists"):
        create_cluster(zk_client, cluster_root, "demo", 1)
    assert zk_client.get_children(cluster_root) == []  # nothing written under it


def test_storage_rules(zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "demo", 4)
    a, b = "h:1", "h:2"
    for storage in (a, b):
        store_metadata.add_storage_node(zk_client, cluster_root, storage, 0, 9000)
    refused: list[tuple[Callable[[], None], str]] = [
        (lambda: store_metadata.add_storage_node(zk_client, cluster_root, a, 1, 1), "already exists"),
        (lambda: store_metadata.add_storage_node(zk_client, cluster_root, "h", 1, 1), "host:port"),
        (lambda: store_metadata.assign_partitions(zk_client, cluster_root, "x:1", [0]), "does not exist"),
        (
            lambda: store_metadata.assign_partitions(zk_client, cluster_root, a, [2, 4]),
            r"\[2, 4\] does not belong",
        ),
        (lambda: store_metadata.assign_partitions(zk_client, cluster_root, a, []), "empty"),
        (lambda: store_metadata.unassign_partitions(zk_client, cluster_root, "x:1", [0]), "not part of any"),
        (
            lambda: store_metadata.unassign_partitions(zk_client, cluster_root, a, [0]),
            "Partition 0 does not exist",
        ),
        (lambda: store_metadata.remove_storage_node(zk_client, cluster_root, "x:1"), "does not exist"),
    ]
    for attempt, message in refused:
        with pytest.raises((StoreMetadataError, AddressError), match=message):
            attempt()

    store_metadata.assign_partitions(zk_client, cluster_root, a, [3, 0, 1, 2])
    store_metadata.assign_partitions(zk_client, cluster_root, b, [1])
    with pytest.raises(StoreMetadataError, match="Partition 1 already exists"):
        store_metadata.assign_partitions(zk_client, cluster_root, a, [1, 2])
    with pytest.raises(StoreMetadataError, match="Partition 1 already exists"):
        store_metadata.assign_partitions(zk_client, cluster_root, b, [0, 1])  # partly new: still refused
    with pytest.raises(StoreMetadataError, match="full partitions after removing 0"):
        store_metadata.unassign_partitions(zk_client, cluster_root, a, [0, 1])
    with pytest.raises(StoreMetadataError, match="cannot be removed when containing partitions"):
        store_metadata.remove_storage_node(zk_client, cluster_root, a)

    store_metadata.unassign_partitions(zk_client, cluster_root, a, [1])  # b still holds 1
    assert store_metadata.read_replica_assignments(zk_client, cluster_root).as_dict() == {
        a: (0, 2, 3),
        b: (1,),
    }
    with pytest.raises(StoreMetadataError, match="full partitions after removing 1"):
        store_metadata.unassign_partitions(zk_client, cluster_root, b, [1])  # now the last copy


def test_remove_storage_node_and_auto_assign(zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "demo", 4)
    with pytest.raises(StoreMetadataError, match="No storage node found in group 0"):
        store_metadata.auto_assign(zk_client, cluster_root, 0)
    for port in STORAGE_PORTS:
        store_metadata.add_storage_node(zk_client, cluster_root, f"localhost:{port}", 0, port + 1)
    store_metadata.add_storage_node(zk_client, cluster_root, "other:1", 1, 2)
    store_metadata.auto_assign(zk_client, cluster_root, 0)
    # The original's HashSet order (57300, 57280, 57290) and its rotated round-robin queue.
    assert store_metadata.read_replica_assignments(zk_client, cluster_root).as_dict() == {
        "localhost:57300": (1,),
        "localhost:57280": (2,),
        "localhost:57290": (0, 3),
        "other:1": (),
    }
    with pytest.raises(StoreMetadataError, match="Found storage node with assignment in group 0"):
        store_metadata.auto_assign(zk_client, cluster_root, 0)

    store_metadata.remove_storage_node(zk_client, cluster_root, "other:1")
    snapshot = read_snapshot(zk_client, cluster_root)
    assert snapshot.groups is not None and "other:1" not in snapshot.groups.as_dict()
    assert snapshot.connections is not None and "other:1" not in snapshot.connections.as_dict()


def test_partition_metadata_compare_and_set(zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "demo", 2)
    read = store_metadata.read_partition_metadata(zk_client, cluster_root, 1)
    assert read == (PartitionMetadata.empty(), NO_VERSION)
    state = ReplicaState(ReplicaId(1, "h:1"), 0, -(1 << 63))
    first = PartitionMetadata(1, 0, (state,))
    assert store_metadata.write_partition_metadata(zk_client, cluster_root, 1, first, NO_VERSION) == 0
    with pytest.raises(ConcurrentUpdateError):
        store_metadata.write_partition_metadata(zk_client, cluster_root, 1, first, NO_VERSION)
    second = first._replace(generation=2)
    assert store_metadata.write_partition_metadata(zk_client, cluster_root, 1, second, 0) == 1
    with pytest.raises(ConcurrentUpdateError, match="concurrent update"):
        store_metadata.write_partition_metadata(zk_client, cluster_root, 1, first, 0)  # a stale writer
    assert store_metadata.read_partition_metadata(zk_client, cluster_root, 1) == (second, 1)


def test_id_counters_hand_out_increasing_ids(zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "demo", 1)
    assert [next_client_id(zk_client, cluster_root) for _ in range(3)] == [1, 2, 3]
    assert next_server_id(zk_client, cluster_root) == 1


def test_admin_lock_excludes_and_hands_over(
    zk_client: KazooClient, cluster_root: str, zookeeper: str
) -> None:
    create_cluster(zk_client, cluster_root, "demo", 1)
    paths = ClusterPaths.of(cluster_root)
    other = KazooClient(hosts=zookeeper)
    other.start()
    try:
        with admin_lock(other, paths):
            ephemeral_owner = zk_client.exists(paths.admin_lock).ephemeralOwner
            assert ephemeral_owner == other.client_id[0]
            held = pytest.raises(AdminLockTimeoutError, match="still held by ZooKeeper session")
            with held, admin_lock(zk_client, paths, timeout_ms=200):
                pass
            release = threading.Event()
            acquired: list[bool] = []

            def waiter() -> None:
                with admin_lock(zk_client, paths):
                    acquired.append(release.is_set())

            thread = threading.Thread(target=waiter)
            thread.start()
            release.set()
        thread.join()
        assert acquired == [True]  # got it only after the holder released
        assert zk_client.exists(paths.admin_lock) is None
    finally:
        other.stop()
        other.close()


def test_store_operations_without_a_cluster_fail_clearly(zk_client: KazooClient, cluster_root: str) -> None:
    with pytest.raises(ClusterNotFoundError, match="create-cluster"):
        store_metadata.add_storage_node(zk_client, cluster_root, "h:1", 0, 1)
    with pytest.raises(ClusterNotFoundError, match="does not exist"):
        read_cluster_params(zk_client, cluster_root)


def test_delete_checks_the_name(zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "demo", 1)
    with pytest.raises(ClusterNameMismatchError, match=r"\[other\] does not match zookeeper value \[demo\]"):
        delete_cluster(zk_client, cluster_root, "other")
    delete_cluster(zk_client, cluster_root, "demo")
    assert zk_client.exists(cluster_root) is None
    with pytest.raises(ClusterNotFoundError):
        delete_cluster(zk_client, cluster_root, "demo")
    create_cluster(zk_client, cluster_root, "demo", 1)
    delete_cluster(zk_client, cluster_root, "other", force=True)
    assert zk_client.exists(cluster_root) is None
