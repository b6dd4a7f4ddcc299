"""`waltz server start` as a real process over real storage nodes and ZooKeeper."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml
from server_process_support import ServerProcess, run_server_to_exit
from server_support.engine_harness import append
from storage_node_support import StorageNodeProcess, create_test_cluster

from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import connect
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    PARTITION_STATE_READY,
    FeedData,
    FeedRequest,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
    ServerPartitionsAssignmentRequest,
)
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT
from waltz_engine.zk.cluster import read_partition_assignment
from waltz_engine.zk.connection import ZooKeeperSettings
from waltz_engine.zk.connection import connect as zk_connect
from waltz_engine.zk.store_metadata import add_storage_node, assign_partitions

NUM_PARTITIONS = 2
NUM_STORAGES = 3
# A partition mounts, and a server takes its share, within this: a bound on the wait, not on the
# attempts (200 attempts 0.1 s apart were 20 s of a loaded machine, less than a node's own start
# may take there: SERVER_READY_TIMEOUT_S).
READY_TIMEOUT_S = 120.0
RETRY_S = 0.1
# An answer: a mount's waits for its partition's recovery.
RECEIVE_TIMEOUT_S = 60.0


def test_bad_config_is_a_one_line_error(zookeeper: str, tmp_path: Path) -> None:
    root = f"/test-no-store-{tmp_path.name}"
    config = tmp_path / "server.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "zookeeper.connectString": zookeeper,
                "zookeeper.sessionTimeout": 10_000,
                "cluster.root": root,
                "server.port": 1,
                "server.minFetchSize": 5000,
            }
        )
    )
    result = run_server_to_exit(config)
    assert result.returncode == 1
    assert "must be less than" in result.stderr and result.stderr.count("\n") == 1


def storage_cluster(zookeeper: str, tmp_path: Path) -> tuple[str, list[StorageNodeProcess]]:
    root, key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    nodes = [
        StorageNodeProcess(zookeeper, root, key, NUM_PARTITIONS, tmp_path / f"storage{i}")
        for i in range(NUM_STORAGES)
    ]
    return root, nodes


def start_storages(zookeeper: str, root: str, storages: list[StorageNodeProcess]) -> None:
    """Start the nodes and give each every partition, on the node and in ZooKeeper."""
    with zk_connect(ZooKeeperSettings(zookeeper, root)) as zk:
        for node in storages:
            node.start()
            node.assign()
            connect_string = f"{node.host}:{node.port}"
            add_storage_node(zk, root, connect_string, 0, node.admin_port)
            assign_partitions(zk, root, connect_string, list(range(NUM_PARTITIONS)))


async def open_client(port: int) -> Any:
    return await connect("127.0.0.1", port, client_context(TlsConfig()), CLIENT_CODECS, CLIENT_HELLO_TEXT)


def generation_of(zookeeper: str, root: str, partition_id: int) -> int:
    """The partition's generation in the coordinator's assignment, as a client reads it: a
    loaded machine can move a partition more often than the test does (a server whose ZooKeeper
    session expired loses its partitions), so no generation is taken for granted."""
    with zk_connect(ZooKeeperSettings(zookeeper, root)) as zk:
        assignment = read_partition_assignment(zk, root)
    (generation,) = [
        info.generation
        for server in assignment.servers
        for info in server.partitions
        if info.partition_id == partition_id
    ]
    return generation


async def _mount(port: int, partition_id: int, client_id: int) -> Any:
    conn = await open_client(port)
    deadline_s = time.monotonic() + READY_TIMEOUT_S
    attempt = 0
    while time.monotonic() < deadline_s:
        await conn.send(MountRequest(ReqId(client_id, 1, partition_id, attempt), -1, 1))
        response = await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S)
        assert isinstance(response, MountResponse)
        if response.partition_state == PARTITION_STATE_READY:
            return conn
        attempt += 1
        await asyncio.sleep(RETRY_S)
    raise AssertionError(f"partition {partition_id} not ready within {READY_TIMEOUT_S} s")


def test_server_with_three_storages_commits_feeds_and_reports(zookeeper: str, tmp_path: Path) -> None:
    root, storages = storage_cluster(zookeeper, tmp_path)
    server = ServerProcess(zookeeper, root, tmp_path / "server")
    try:
        start_storages(zookeeper, root, storages)
        server.start()

        async def go() -> None:
            conn = await _mount(server.port, 0, 1)
            generation = generation_of(zookeeper, root, 0)  # the one the server holds
            reqs = [ReqId(1, generation, 0, 100 + i) for i in range(3)]
            for i, req_id in enumerate(reqs):
                await conn.send(append(req_id, -1, b"real-%d" % i, header=i))
            await conn.send(FlushRequest(ReqId(1, generation, 0, 200)))
            flushed = await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S)
            assert flushed == FlushResponse(ReqId(1, generation, 0, 200), 2)
            await conn.send(FeedRequest(ReqId(1, generation, 0, 201), -1))
            fed = [await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S) for _ in range(3)]
            assert fed == [FeedData(req_id, i, i) for i, req_id in enumerate(reqs)]
            await conn.close()

        asyncio.run(go())
        status, body = server.http_get("/health")
        health = json.loads(body)["server-health-check"]
        assert status == 200 and health["healthy"], body
        assert json.loads(health["message"])["zookeeper"] is True
        status, body = server.http_get("/metrics")
        metrics = json.loads(body)
        gauges, meters = metrics["gauges"], metrics["meters"]
        for name in ("is-closed", "cluster-name", "server-id", "endpoint", "waltz-server-num-partitions"):
            assert f"waltz-server.{name}" in gauges
        assert gauges["waltz-server.waltz-server-num-partitions"]["value"] == NUM_PARTITIONS
        assert sorted(gauges["waltz-server.replica-info"]["value"]["0"]) == sorted(
            f"{n.host}:{n.port}" for n in storages
        )
        assert meters["waltz-server.partition-0.successful-append"]["count"] == 3
        assert gauges["waltz-server.partition-0.high-water-mark"]["value"] == 2
        assert "waltz-server.feed-cache-miss" in meters
        status, body = server.http_get("/metrics/prometheus")
        assert status == 200 and b"waltz_server_partition_0_high_water_mark 2" in body
        assert server.terminate() == 0, server.log_text()
    finally:
        server.close()
        for node in storages:
            node.close()


def test_moved_partition_refuses_the_old_generation(zookeeper: str, tmp_path: Path) -> None:
    root, storages = storage_cluster(zookeeper, tmp_path)
    first = ServerProcess(zookeeper, root, tmp_path / "server1")
    second = ServerProcess(zookeeper, root, tmp_path / "server2")
    try:
        start_storages(zookeeper, root, storages)
        first.start()

        async def owned(server: ServerProcess) -> tuple[int, ...]:
            conn = await open_client(server.port)
            await conn.send(ServerPartitionsAssignmentRequest(ReqId(9, 0, 0, 0)))
            response = await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S)
            await conn.close()
            return tuple(response.server_partition_assignments)

        async def wait_owned(server: ServerProcess, count: int) -> tuple[int, ...]:
            deadline_s = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline_s:
                found = await owned(server)
                if len(found) == count:
                    return found
                await asyncio.sleep(RETRY_S)
            raise AssertionError(f"server did not own {count} partitions within {READY_TIMEOUT_S} s")

        asyncio.run(wait_owned(first, NUM_PARTITIONS))
        held = {
            partition_id: generation_of(zookeeper, root, partition_id)
            for partition_id in range(NUM_PARTITIONS)
        }
        second.start()

        async def go() -> None:
            (moved,) = await wait_owned(second, 1)
            conn = await _mount(second.port, moved, 1)
            # The generation the first server held it in; the move gave the second a newer one.
            old, new = held[moved], generation_of(zookeeper, root, moved)
            assert new > old
            await conn.send(append(ReqId(1, old, moved, 50), -1, b"stale generation"))
            await conn.send(FlushRequest(ReqId(1, old, moved, 51)))
            assert await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S) == FlushResponse(
                ReqId(1, old, moved, 51), -1
            )
            await conn.send(append(ReqId(1, new, moved, 52), -1, b"current generation"))
            await conn.send(FlushRequest(ReqId(1, new, moved, 53)))
            assert await asyncio.wait_for(conn.receive(), RECEIVE_TIMEOUT_S) == FlushResponse(
                ReqId(1, new, moved, 53), 0
            )
            await conn.close()

        asyncio.run(go())
        assert second.terminate() == 0 and first.terminate() == 0
    finally:
        second.close()
        first.close()
        for node in storages:
            node.close()
