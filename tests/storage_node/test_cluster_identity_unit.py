"""The rules a storage node started without ZooKeeper applies once ZooKeeper answers (pure logic;
the real-process test is test_storage_node_starts_without_zookeeper.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

from waltz_engine.storage.file_system import OS_DISK
from waltz_engine.storage.node.cluster_identity import (
    StoreIdentity,
    ZooKeeperView,
    another_cluster,
    disk_params,
    no_longer_assigned,
)
from waltz_engine.storage.storage_manager import StorageManager

KEY = uuid.uuid4()


def test_what_zookeeper_no_longer_assigns_is_taken_back_but_a_move_onto_the_node_is_not() -> None:
    view = ZooKeeperView(StoreIdentity(KEY, 4), (0,), frozenset({2}))
    assert no_longer_assigned(view, [0, 1, 2]) == [1]  # 2: a recorded move's target, mid-copy
    # A node not registered under its own name (a wildcard host, another spelling) is left as it is.
    assert no_longer_assigned(ZooKeeperView(StoreIdentity(KEY, 4), None, frozenset()), [0, 1]) == []


def test_another_cluster_is_named_by_key_or_partition_count() -> None:
    mine = StoreIdentity(KEY, 4)
    assert another_cluster(mine, StoreIdentity(KEY, 4), "/c") is None
    other = uuid.uuid4()
    key_differs = another_cluster(mine, StoreIdentity(other, 4), "/c")
    assert key_differs == f"the cluster key does not match (the disk has {KEY}, ZooKeeper's /c {other})"
    count_differs = another_cluster(mine, StoreIdentity(KEY, 5), "/c")
    assert count_differs == "the number of partitions does not match (the disk has 4, ZooKeeper's /c 5)"


def test_only_a_formatted_directory_names_a_cluster(tmp_path: Path) -> None:
    assert disk_params(OS_DISK, tmp_path) is None  # no control file: wait for ZooKeeper
    StorageManager(tmp_path, KEY, 3).close()
    assert disk_params(OS_DISK, tmp_path) == StoreIdentity(KEY, 3)
    (tmp_path / "waltz-storage.ctl").write_bytes(b"\0" * 10)  # shorter than its header
    assert disk_params(OS_DISK, tmp_path) is None
