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


def _format_and_stop(node: StorageNodeProcess, partitions: list[int]) -> None:
    """Start the node with ZooKeeper up, give it ``partitions`` with 5 records each, stop it."""
    node.start()
    node.assign(partitions)

    async def write() -> None:
        client = node.data_client()
        await client.open()
        for p in partitions:
            await client.append(-1, p, make_records(0, 5, p))
        await client.close()

    node.run(write())
    assert node.terminate() == 0


def test_nodes_serve_their_disks_while_zookeeper_is_out_and_check_it_when_it_answers(tmp_path: Path) -> None:
    """One outage, two nodes (a ZooKeeper start costs seconds): ``ours`` is the cluster's node,
    whose partition 1 moved away while it was down; ``stray``'s directory is cluster A's, its
    configuration cluster B's (an operator's slip)."""
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", free_tcp_port())
    zookeeper.start()
    nodes: list[StorageNodeProcess] = []
    try:
        connect_string = zookeeper.connect_string
        root, key = create_test_cluster(connect_string, 2)
        ours = StorageNodeProcess(connect_string, root, key, 2, tmp_path / "ours", jetty=False)
        nodes.append(ours)
        storage = f"{ours.host}:{ours.port}"
        with connect(ZooKeeperSettings(connect_string, root)) as client:
            add_storage_node(client, root, storage, 0, ours.admin_port)
            assign_partitions(client, root, storage, [0, 1])
        _format_and_stop(ours, [0, 1])
        # While it is down, partition 1's replica moves to another node (ZooKeeper's record: the
        # other node never runs here).
        elsewhere = f"{ours.host}:{free_tcp_port()}"
        with connect(ZooKeeperSettings(connect_string, root)) as client:
            add_storage_node(client, root, elsewhere, 0, free_tcp_port())
            assign_partitions(client, root, elsewhere, [1])
            unassign_partitions(client, root, storage, [1])

        root_a, key_a = create_test_cluster(connect_string, 1)
        root_b, key_b = create_test_cluster(connect_string, 1)
        _format_and_stop(StorageNodeProcess(connect_string, root_a, key_a, 1, tmp_path / "stray"), [0])
        stray = StorageNodeProcess(connect_string, root_b, key_b, 1, tmp_path / "stray", jetty=False)
        stray.key = key_a  # the readiness probe opens with the disk's key
        nodes.append(stray)
        zookeeper.stop()

        ours.start()  # ready without ZooKeeper
        log = ours.log_text()
        assert log.count(STARTED_WITHOUT) == 1, log
        assert f"key {key}, 2 partitions" in log
        assert _records_of(ours, key, 0) == make_records(0, 5, 0)
        assert _records_of(ours, key, 1) == make_records(0, 5, 1)  # blind: its control file's
        with pytest.raises(StorageRpcError, match="Provided cluster key is inconsistent"):
            _records_of(ours, uuid.uuid4(), 0)
        stray.start()  # as cluster A's disk: no server of B is served
        assert f"key {key_a}, 1 partitions" in stray.log_text()
        with pytest.raises(StorageRpcError, match="Provided cluster key is inconsistent"):
            _records_of(stray, key_b, 0)

        zookeeper.start()  # the same data directory: the clusters as they were
        log = _wait_for_log(ours, "ZooKeeper answers")
        assert f"key {key} confirmed; partitions [1] are no longer assigned to this node there" in log
        assert ours.run(ours.with_admin(lambda a: a.assigned_partition_status())) == {0: True}
        assert _records_of(ours, key, 0) == make_records(0, 5, 0)
        with pytest.raises(StorageRpcError, match="not assigned"):
            _records_of(ours, key, 1)
        assert list((ours.directory / "1").glob("*.seg")), "files are kept"
        assert ours.terminate() == 0

        assert stray.wait_exit(LOG_TIMEOUT_S) == 1
        errors = [line for line in stray.log_text().splitlines() if line.startswith("error:")]
        assert len(errors) == 1, stray.log_text()
        assert "the cluster key does not match" in errors[0]
        assert "the disk belongs to another cluster" in errors[0]
        assert "Traceback" not in stray.log_text()
    finally:
        for node in nodes:
            node.close()
        zookeeper.stop()
