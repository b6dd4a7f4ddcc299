"""The client over TLS sockets and the 'L' codec against an in-process fake server; ZooKeeper discovery."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.fake_server import FakeWaltzServer
from client_support.harness import run
from client_support.static_driver import StaticDriver
from testkit import free_tcp_port

from waltz_engine.client import (
    ClientAheadError,
    ClientTimeoutError,
    MockServerPartition,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_engine.wire.client_messages import FeedRequest, MountRequest
from waltz_engine.zk.connection import ZooKeeperError
from waltz_engine.zk.payloads import PartitionInfo

FAST = {"not_ready_retry_ms": 50, "reconnect_delay_ms": 50}


async def start_client(driver: StaticDriver, callbacks: MockCallbacks, **config: Any) -> WaltzClient:
    return await WaltzClient.create(callbacks, WaltzClientConfig(mock_driver=driver, **{**FAST, **config}))


def test_append_feed_data_and_high_water_mark_over_tls() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(2))
        await server.start()
        callbacks = MockCallbacks(fetch_data=True)
        driver = StaticDriver({server.endpoint: [PartitionInfo(0, 3), PartitionInfo(1, 3)]}, 2)
        client = await start_client(driver, callbacks)
        try:
            contexts = [MockContext(f"t{i}", partition=i % 2, header=i) for i in range(250)]
            for context in contexts:
                await client.submit(context)
            await client.flush()
            assert all([await c.result() for c in contexts])
            await callbacks.wait_for_high_water_mark(0, 124)
            await callbacks.wait_for_high_water_mark(1, 124)
            assert sorted(callbacks.data) == sorted(c.data for c in contexts)  # type: ignore[type-var]
            assert await client.high_water_mark(1) == 124
            mounts = [m for m in server.received if isinstance(m, MountRequest)]
            assert {(m.req_id.partition_id, m.req_id.generation, m.seq_num) for m in mounts} == {
                (0, 3, 1),
                (1, 3, 1),
            }
            assert all(r.generation == 3 and r.client_id == 7 for _, _, _, r in callbacks.applied)
            # 125 transactions per partition > a 100-transaction fetch: the feed was suspended, asked again.
            feeds = [m for m in server.received if isinstance(m, FeedRequest) and m.req_id.partition_id == 0]
            assert len(feeds) >= 2
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_highest_common_codec_version_is_used() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1), versions=(0, 1))
        await server.start()
        driver = StaticDriver({server.endpoint: [PartitionInfo(0, 0)]}, 1)
        client = await start_client(driver, MockCallbacks())
        try:
            context = MockContext("v1", write_locks=[1], read_locks=[2])
            await client.submit(context)
            assert await context.result()
            assert {conn.version for conn in server.connections} == {1}
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_not_ready_is_retried_until_the_partition_moves() -> None:
    async def go() -> None:
        partitions = MockServerPartition.create(1)
        old, new = FakeWaltzServer(partitions, owned=()), FakeWaltzServer(partitions)
        await old.start()
        await new.start()
        driver = StaticDriver({old.endpoint: [PartitionInfo(0, 1)]}, 1)
        client = await start_client(driver, MockCallbacks())
        try:
            context = MockContext("moved")
            submitted = asyncio.ensure_future(client.submit(context))
            while sum(isinstance(m, MountRequest) for m in old.received) < 3:  # NOT_READY, retried
                await asyncio.sleep(0.01)
            assert not submitted.done()
            driver.move({new.endpoint: [PartitionInfo(0, 2)]})
            await submitted
            assert await context.result()
            (mount,) = [m for m in new.received if isinstance(m, MountRequest)]
            assert mount.req_id.generation == 2
        finally:
            await client.close()
            await old.stop()
            await new.stop()

    run(go)


def test_dropped_connection_reconnects_with_the_next_seq_num() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        await server.start()
        callbacks = MockCallbacks()
        client = await start_client(StaticDriver({server.endpoint: [PartitionInfo(0, 0)]}, 1), callbacks)
        try:
            await client.submit(MockContext("before"))
            await client.flush()
            await server.drop_connections()
            context = MockContext("after")
            await client.submit(context)
            assert await context.result()
            seqs = sorted({m.seq_num for m in server.received if isinstance(m, MountRequest)})
            assert seqs == [1, 2]
            await callbacks.wait_for_high_water_mark(0, 1)
            assert [t for _, t, _, _ in callbacks.applied] == [0, 1]
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_a_server_that_left_and_came_back_is_mounted_with_a_newer_seq_num() -> None:
    # The server keeps the mount of the newest (generation, seq_num) of a client; a connection
    # opened after the server rejoined must outrank the one before it (the simulator's seed 233).
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        await server.start()
        driver = StaticDriver({server.endpoint: [PartitionInfo(0, 0)]}, 1)
        client = await start_client(driver, MockCallbacks())
        try:
            await client.submit(MockContext("before"))
            await client.flush()
            driver.move({})  # the server left the cluster: its network client is dropped
            driver.move({server.endpoint: [PartitionInfo(0, 0)]})
            context = MockContext("after")
            await client.submit(context)
            assert await context.result()
            seqs = [m.seq_num for m in server.received if isinstance(m, MountRequest)]
            assert seqs == [1, 2]
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_client_ahead_of_the_server_is_a_clear_error() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        await server.start()
        client = await start_client(
            StaticDriver({server.endpoint: [PartitionInfo(0, 0)]}, 1), MockCallbacks({0: 10})
        )
        try:
            context = MockContext("x")
            with pytest.raises(ClientAheadError, match="high-water mark 10 is ahead of the server's -1"):
                await client.submit(context)
            assert context.events == ["exception:ClientAheadError"]
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_no_reachable_server_ends_every_call_within_its_timeout() -> None:
    async def go() -> None:
        nobody = f"127.0.0.1:{free_tcp_port()}"
        driver = StaticDriver({nobody: [PartitionInfo(0, 0)]}, 1)
        client = await start_client(
            driver, MockCallbacks(), ensure_mounted_timeout_ms=300, rpc_timeout_ms=300
        )
        try:
            context = MockContext("nowhere")
            with pytest.raises(ClientTimeoutError, match="not mounted within 300 ms"):
                await client.submit(context)
            assert context.events == ["exception:ClientTimeoutError"]
            with pytest.raises(ClientTimeoutError, match="within 300 ms"):
                await client.high_water_mark(0)
            with pytest.raises(ClientTimeoutError):
                await client.rpc_client.get_transaction_data(0, 0)
            await client.flush()  # nothing pending: nothing to wait for
        finally:
            await client.close()

    run(go)


def test_zookeeper_discovery_gives_ids_and_partitions(
    zookeeper: str, zk_client: Any, cluster_root: str
) -> None:
    from waltz_engine.zk.cluster import create_cluster

    create_cluster(zk_client, cluster_root, "client-test", 3)
    keys = {
        "zookeeper.connectString": zookeeper,
        "zookeeper.sessionTimeout": 30000,
        "cluster.root": cluster_root,
        "client.maxConcurrentTransactions": 7,
    }

    async def go() -> None:
        config = WaltzClientConfig.from_config(keys, ensure_mounted_timeout_ms=300)
        assert config.max_concurrent_transactions == 7 and config.long_wait_threshold_ms == 5000
        async with (
            WaltzClient(MockCallbacks(), config) as first,
            WaltzClient(MockCallbacks(), config) as second,
        ):
            assert (first.client_id, second.client_id) == (1, 2)
            assert (first.cluster_name, first.num_partitions, first.get_partitions()) == (
                "client-test",
                3,
                {0, 1, 2},
            )
            # No server has joined: a clear timeout, not a hang.
            with pytest.raises(ClientTimeoutError, match="partition 2 was not mounted within 300 ms"):
                await first.submit(MockContext("x", partition=2))

    run(go)


def test_unreachable_zookeeper_is_a_clear_error() -> None:
    keys = {
        "zookeeper.connectString": f"127.0.0.1:{free_tcp_port()}",
        "zookeeper.connectTimeout": 300,
        "cluster.root": "/nowhere",
    }

    async def go() -> None:
        with pytest.raises(ZooKeeperError, match="no answer within 300 ms"):
            await WaltzClient.create(MockCallbacks(), WaltzClientConfig.from_config(keys))

    run(go)
