"""Quorum, health and failover with real processes: ZooKeeper, 3 storage nodes, servers, a client.

Issue 4's proofs that need the whole stack: a write commits only with 2 of 3 storages; with
two storages down writes stop and /health and `cluster verify` say why; they resume when one
returns; nothing acknowledged is lost; the replicas end byte-equal; a partition that moves to
another server gets a new generation and the client follows it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.client import WaltzClient
from waltz_engine.common.address import HostPort
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.server.rpc_client import ServerRpcClient
from waltz_engine.storage.admin_ops import (
    StorageContext,
    max_transaction_id,
    replica_checksums,
)
from waltz_engine.zk.cluster import read_partition_assignment
from waltz_engine.zk.cluster_manager import force_assign
from waltz_engine.zk.connection import connect
from waltz_engine.zk.store_metadata import read_store_params

COMMIT_TIMEOUT_S = 60.0
STALLED_FOR_S = 3.0
CATCH_UP_TIMEOUT_S = 60.0
POLL_S = 0.2


def _health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _verify(cluster: LocalCluster) -> Any:
    return CliRunner().invoke(
        app,
        ["cluster", "verify", "-z", cluster.zookeeper, "-r", cluster.cluster_root, "--timeout-ms", "5000"],
    )


async def _commit(client: WaltzClient, data: str, partition: int = 0) -> MockContext:
    context = MockContext(data, partition=partition)
    await client.submit(context)
    assert await context.result(COMMIT_TIMEOUT_S)
    return context


async def _wait_replicas_at(cluster: LocalCluster, context: StorageContext, txid: int) -> None:
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    for node in cluster.storages:
        address = HostPort("127.0.0.1", node.admin_port)
        while (seen := await max_transaction_id(context, address, node.port, 0, offline=False)) < txid:
            assert time.monotonic() < deadline, f"{node.name} stuck at {seen}, expected {txid}"
            await asyncio.sleep(POLL_S)


async def _wait_until_released(cluster: LocalCluster, partition: int) -> None:
    """Until exactly one server holds ``partition`` (the old owner has closed it)."""
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    while True:
        holders = 0
        for server in cluster.servers:
            endpoint = HostPort("127.0.0.1", server.port)
            async with ServerRpcClient(endpoint, client_context(TlsConfig())) as rpc:
                holders += partition in await rpc.server_partitions()
        if holders == 1:
            return
        assert time.monotonic() < deadline, f"partition {partition} held by {holders} servers"
        await asyncio.sleep(POLL_S)


def test_quorum_loss_is_reported_and_writes_resume_without_loss(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as cluster:
        server = cluster.servers[0]
        with connect(cluster.zookeeper_settings()) as zk:
            key = read_store_params(zk, cluster.cluster_root).key
        storage_context = StorageContext(key, 1, client_context(TlsConfig()))

        async def go() -> None:
            callbacks = MockCallbacks()
            async with WaltzClient(callbacks, waltz_client_config(cluster)) as client:
                await _commit(client, "all three up")
                cluster.storages[0].kill()
                await _commit(client, "two of three")  # a quorum is still there

                cluster.storages[1].kill()
                stalled = MockContext("one of three", partition=0)
                await client.submit(stalled)
                await asyncio.sleep(STALLED_FOR_S)
                assert not stalled.future.done(), "committed without a quorum"

                status, body = await asyncio.to_thread(_health, server.jetty_port)
                assert status == 500, body
                details = json.loads(body["server-health-check"]["message"])
                assert details["partitions"] == {"0": False}
                verify = await asyncio.to_thread(_verify, cluster)
                assert verify.exit_code == 1, verify.output
                assert "PARTITION_QUORUM_STATUS" in verify.output, verify.output

                await asyncio.to_thread(cluster.storages[1].restart)
                assert await stalled.result(COMMIT_TIMEOUT_S)
                await asyncio.to_thread(cluster.storages[0].restart)
                await callbacks.wait_for_high_water_mark(0, 2, COMMIT_TIMEOUT_S)
                assert [a[1] for a in callbacks.applied] == [0, 1, 2]
                await _wait_replicas_at(cluster, storage_context, 2)
                status, _ = await asyncio.to_thread(_health, server.jetty_port)
                assert status == 200

        asyncio.run(go())
        for node in cluster.servers + cluster.storages:
            assert node.stop(), f"{node.name} did not stop"
        checksums = [
            replica_checksums(node.directory / "data", key, 1).checksums for node in cluster.storages
        ]
        assert checksums[0] == checksums[1] == checksums[2], checksums


def test_a_moved_partition_gets_a_new_generation_and_the_client_follows(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=2, partitions=2, zookeeper=zookeeper) as cluster:

        def owner_and_generation(zk: Any, partition: int) -> tuple[int, int]:
            assignment = read_partition_assignment(zk, cluster.cluster_root)
            for server_id, partitions in assignment.servers:
                for info in partitions:
                    if info.partition_id == partition:
                        return server_id, info.generation
            raise AssertionError(f"partition {partition} is not assigned")

        async def go() -> None:
            callbacks = MockCallbacks()
            async with WaltzClient(callbacks, waltz_client_config(cluster)) as client:
                await _commit(client, "before the move")
                with connect(cluster.zookeeper_settings()) as zk:
                    owner, generation = owner_and_generation(zk, 0)
                    servers = read_partition_assignment(zk, cluster.cluster_root).servers
                    other = next(server_id for server_id, _ in servers if server_id != owner)
                    force_assign(zk, cluster.cluster_root, 0, other)
                    deadline = time.monotonic() + COMMIT_TIMEOUT_S
                    while owner_and_generation(zk, 0)[0] != other:
                        assert time.monotonic() < deadline, "partition 0 did not move"
                        await asyncio.sleep(POLL_S)
                    assert owner_and_generation(zk, 0)[1] == generation + 1
                # Until the old owner lets go, an append it already had may still commit there
                # (storage sessions fence it, as in the original); after that, only the new owner can.
                await _wait_until_released(cluster, 0)
                await _commit(client, "after the move")
                await callbacks.wait_for_high_water_mark(0, 1, COMMIT_TIMEOUT_S)
                applied = [a for a in callbacks.applied if a[0] == 0]
                assert [a[1] for a in applied] == [0, 1]
                assert applied[1][3].generation == generation + 1  # appended through the new owner

        asyncio.run(go())
