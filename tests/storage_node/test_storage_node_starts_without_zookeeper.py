"""A storage node whose directory is formatted starts from its disk while ZooKeeper is out (issue
32, the simulator's seed 41354): it serves its replicas to the cluster its control file names,
refuses every other key, and once ZooKeeper answers it unassigns what ZooKeeper no longer gives it
and stops for good if the disk belongs to another cluster. A new directory still waits for
ZooKeeper (test_storage_node_zookeeper_start.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from storage_node_support import (
    StorageNodeProcess,
    client_ssl,
    create_test_cluster,
    free_tcp_port,
    make_records,
)

from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.server import EmbeddedZooKeeper
from waltz_engine.zk.store_metadata import add_storage_node, assign_partitions, unassign_partitions

LOG_TIMEOUT_S = 60.0
STARTED_WITHOUT = "storage node starting without ZooKeeper"


def _wait_for_log(node: StorageNodeProcess, text: str) -> str:
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while text not in (log := node.log_text()):
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{log}"
        time.sleep(0.1)
    return log


def _records_of(node: StorageNodeProcess, key: uuid.UUID, partition_id: int) -> list[object]:
    async def go() -> list[object]:
        client = StorageClient(node.host, node.port, client_ssl(), key, node.num_partitions)
        await client.open()
        try:
            return list(await client.records(-1, partition_id, 0, 100))
        finally:
            await client.close()

    return node.run(go())


def test_node_serves_its_disk_while_zookeeper_is_out_and_unassigns_what_zookeeper_moved(
    tmp_path: Path,
) -> None:
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", free_tcp_port())
    zookeeper.start()
    node: StorageNodeProcess | None = None
    try:
        root, key = create_test_cluster(zookeeper.connect_string, 2)
        node = StorageNodeProcess(zookeeper.connect_string, root, key, 2, tmp_path / "node", jetty=False)
        storage = f"{node.host}:{node.port}"
        with connect(ZooKeeperSettings(zookeeper.connect_string, root)) as client:
            add_storage_node(client, root, storage, 0, node.admin_port)
            assign_partitions(client, root, storage, [0, 1])
        node.start()
        node.assign([0, 1])

        async def write() -> None:
            client = node.data_client()
            await client.open()
            for p in (0, 1):
                await client.append(-1, p, make_records(0, 5, p))
            await client.close()

        node.run(write())
        assert node.terminate() == 0
        # While the node is down, partition 1's replica moves to another node (ZooKeeper's record:
        # the other node never runs here).
        elsewhere = f"{node.host}:{free_tcp_port()}"
        with connect(ZooKeeperSettings(zookeeper.connect_string, root)) as client:
            add_storage_node(client, root, elsewhere, 0, free_tcp_port())
            assign_partitions(client, root, elsewhere, [1])
            unassign_partitions(client, root, storage, [1])
        zookeeper.stop()

        node.start()  # ready without ZooKeeper
        log = node.log_text()
        assert log.count(STARTED_WITHOUT) == 1, log
        assert f"key {key}, 2 partitions" in log
        assert _records_of(node, key, 0) == make_records(0, 5, 0)
        assert _records_of(node, key, 1) == make_records(0, 5, 1)  # blind: its control file's
        with pytest.raises(StorageRpcError, match="Provided cluster key is inconsistent"):
            _records_of(node, uuid.uuid4(), 0)

        zookeeper.start()  # the same data directory: the cluster, now without 1 on this node
        log = _wait_for_log(node, "ZooKeeper answers")
        assert f"key {key} confirmed; partitions [1] are no longer assigned to this node there" in log
        assert node.run(node.with_admin(lambda a: a.assigned_partition_status())) == {0: True}
        assert _records_of(node, key, 0) == make_records(0, 5, 0)
        with pytest.raises(StorageRpcError, match="not assigned"):
            _records_of(node, key, 1)
        assert list((node.directory / "1").glob("*.seg")), "files are kept"
        assert node.terminate() == 0
    finally:
        if node is not None:
            node.close()
        zookeeper.stop()


def test_a_disk_of_another_cluster_is_refused_once_zookeeper_answers(tmp_path: Path) -> None:
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", free_tcp_port())
    zookeeper.start()
    node: StorageNodeProcess | None = None
    try:
        root_a, key_a = create_test_cluster(zookeeper.connect_string, 1)
        root_b, key_b = create_test_cluster(zookeeper.connect_string, 1)
        formatted = StorageNodeProcess(
            zookeeper.connect_string, root_a, key_a, 1, tmp_path / "n", jetty=False
        )
        formatted.start()
        assert formatted.terminate() == 0
        # The same directory, configured for cluster B (an operator's slip), started while
        # ZooKeeper is out: it starts as cluster A's disk and serves no server of B.
        node = StorageNodeProcess(zookeeper.connect_string, root_b, key_b, 1, tmp_path / "n", jetty=False)
        zookeeper.stop()
        node.key = key_a  # the readiness probe opens with the disk's key
        node.start()
        assert f"key {key_a}, 1 partitions" in node.log_text()
        with pytest.raises(StorageRpcError, match="Provided cluster key is inconsistent"):
            _records_of(node, key_b, 0)

        zookeeper.start()
        assert node.wait_exit(LOG_TIMEOUT_S) == 1
        errors = [line for line in node.log_text().splitlines() if line.startswith("error:")]
        assert len(errors) == 1, node.log_text()
        assert "the cluster key does not match" in errors[0]
        assert "the disk belongs to another cluster" in errors[0]
        assert "Traceback" not in node.log_text()
    finally:
        if node is not None:
            node.close()
        zookeeper.stop()
