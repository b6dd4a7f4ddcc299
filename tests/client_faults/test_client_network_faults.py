"""The original's ServerClientNetworkFaultTest (reference §5.1) on a real cluster (3 storage nodes, 1 server).

A TCP proxy sits between the client and the server (``WaltzClientConfig.endpoint_overrides``
sends the client to it); every 100th transaction schedules 1-5 disconnects at random moments.
Afterwards a fresh client, connected directly, reads the log back: what the callbacks applied
must be exactly the stored log, and the stored data exactly what was submitted.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import pytest
from client_support.app import STRINGS, MockContext
from cluster_support import module_cluster, waltz_client_config

from waltz_engine.client import ClientTimeoutError, Transaction, WaltzClient, WaltzClientCallbacks
from waltz_engine.net.tcp_proxy import HOST, TcpProxy
from waltz_engine.ops.devcluster import LocalCluster

NUM_PARTITIONS = 4
NUM_TRANSACTIONS = 1_000
FAULT_EVERY_N_TRANSACTIONS = 100
MIN_DISCONNECTS, MAX_DISCONNECTS = 1, 5
# The original's delay after a failed connect is 1 s; shorter keeps the many reconnects quick.
RECONNECT_DELAY_MS = 100
NUM_LOCK_IDS = 16  # a few conflicts too, so retries happen under the faults
SEED = 20_130_2
TEST_BOUND_S = 180.0
WAIT_S = 60.0
POLL_S = 0.01
# With the server stopped: short client timeouts, and a bound well beyond them that would
# show a call hanging (a bare TimeoutError instead of the client's ClientTimeoutError).
SHORT_TIMEOUT_MS = 1_500
HANG_BOUND_S = 10 * SHORT_TIMEOUT_MS / 1000


cluster = module_cluster(storages=3, partitions=NUM_PARTITIONS)


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(test, TEST_BOUND_S))


class RecordingCallbacks(WaltzClientCallbacks):
    """Applies in order from ``start`` on, fetching each transaction's data; records what it applied."""

    def __init__(self, num_partitions: int) -> None:
        self.applied: dict[int, list[tuple[int, str]]] = {p: [] for p in range(num_partitions)}
        self.errors: list[str] = []

    def high_water_mark(self, partition_id: int) -> int:
        applied = self.applied[partition_id]
        return applied[-1][0] if applied else -1

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_mark(partition_id)

    async def apply_transaction(self, transaction: Transaction) -> None:
        partition_id, transaction_id = transaction.partition_id, transaction.transaction_id
        data = await transaction.data(STRINGS)
        if transaction_id != self.high_water_mark(partition_id) + 1:  # a gap or a second application
            self.errors.append(
                f"partition {partition_id}: got {transaction_id} after {self.high_water_mark(partition_id)}"
            )
        self.applied[partition_id].append((transaction_id, data))

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append(f"partition {partition_id} transaction {transaction_id}: {exception!r}")

    async def wait_until(self, high_water_marks: dict[int, int]) -> None:
        for partition_id, target in high_water_marks.items():
            while self.high_water_mark(partition_id) < target:
                await asyncio.sleep(POLL_S)


async def connected(proxy: TcpProxy) -> None:
    while proxy.num_connections == 0:
        await asyncio.sleep(POLL_S)


async def server_high_water_marks(client: WaltzClient) -> dict[int, int]:
    return {p: await client.high_water_mark(p) for p in range(client.num_partitions)}


async def read_back(cluster: LocalCluster) -> dict[int, list[tuple[int, str]]]:
    """The whole log, through a fresh client connected straight to the server."""
    reader = RecordingCallbacks(NUM_PARTITIONS)
    async with WaltzClient(reader, waltz_client_config(cluster)) as client:
        await asyncio.wait_for(reader.wait_until(await server_high_water_marks(client)), WAIT_S)
    assert reader.errors == []
    return reader.applied


async def proxy_to_server(cluster: LocalCluster) -> TcpProxy:
    return await TcpProxy(HOST, cluster.servers[0].port).start()


def through(cluster: LocalCluster, proxy: TcpProxy, **overrides: Any) -> dict[str, Any]:
    return {"endpoint_overrides": {cluster.servers[0].connect_string: proxy.connect_string}, **overrides}


def test_endpoint_overrides_send_the_client_through_the_proxy(cluster: LocalCluster) -> None:
    async def test() -> None:
        proxy = await proxy_to_server(cluster)
        try:
            callbacks = RecordingCallbacks(NUM_PARTITIONS)
            async with WaltzClient(
                callbacks, waltz_client_config(cluster, **through(cluster, proxy))
            ) as client:
                context = MockContext("through the proxy", partition=1)
                await client.submit(context)
                assert await context.result(WAIT_S)
                assert proxy.disconnect_all() >= 2  # the stream and the RPC connection
        finally:
            await proxy.close()

    run(test())


def test_random_disconnects_lose_and_duplicate_nothing(cluster: LocalCluster) -> None:
    async def test() -> None:
        rng = random.Random(SEED)
        proxy = await proxy_to_server(cluster)
        callbacks = RecordingCallbacks(NUM_PARTITIONS)
        contexts: list[MockContext] = []
        cuts: list[int] = []  # indices of the transactions after which the proxy cuts connections
        cut_connections: list[int] = []
        try:
            config = waltz_client_config(
                cluster, **through(cluster, proxy, reconnect_delay_ms=RECONNECT_DELAY_MS)
            )
            async with WaltzClient(callbacks, config) as client:
                for i in range(NUM_TRANSACTIONS):
                    if i % FAULT_EVERY_N_TRANSACTIONS == 0:
                        count = rng.randint(MIN_DISCONNECTS, MAX_DISCONNECTS)
                        cuts.extend(rng.sample(range(i, i + FAULT_EVERY_N_TRANSACTIONS), count))
                    context = MockContext(
                        f"txn-{i}",
                        partition=rng.randrange(NUM_PARTITIONS),
                        write_locks=[rng.randrange(NUM_LOCK_IDS)],
                    )
                    contexts.append(context)
                    await client.submit(context)
                    for _ in range(cuts.count(i)):
                        # Cut live connections, with this append (and others) in flight.
                        await asyncio.wait_for(connected(proxy), WAIT_S)
                        cut_connections.append(proxy.disconnect_all())
                assert [await c.result(WAIT_S) for c in contexts] == [True] * NUM_TRANSACTIONS
                await asyncio.wait_for(callbacks.wait_until(await server_high_water_marks(client)), WAIT_S)
        finally:
            await proxy.close()
        assert len(cut_connections) == len(cuts) and min(cut_connections) > 0
        assert callbacks.errors == []

        stored = await read_back(cluster)
        # The sequence applied by the callbacks is the stored one, from the start of this test on.
        for partition_id, applied in callbacks.applied.items():
            assert applied == stored[partition_id][len(stored[partition_id]) - len(applied) :]
        submitted = Counter(c.data for c in contexts)
        stored_here = Counter(data for log in stored.values() for _, data in log if data.startswith("txn-"))
        assert stored_here == submitted  # nothing lost, nothing twice
        assert sum(len(a) for a in callbacks.applied.values()) >= NUM_TRANSACTIONS

    run(test())


def test_with_the_server_stopped_every_call_ends_with_a_timeout_error(cluster: LocalCluster) -> None:
    short = {
        "ensure_mounted_timeout_ms": SHORT_TIMEOUT_MS,
        "registration_timeout_ms": SHORT_TIMEOUT_MS,
        "rpc_timeout_ms": SHORT_TIMEOUT_MS,
        "flush_timeout_ms": SHORT_TIMEOUT_MS,
    }

    async def expect_timeout(call: Coroutine[Any, Any, Any]) -> None:
        with pytest.raises(ClientTimeoutError, match=f"{SHORT_TIMEOUT_MS} ms"):
            await asyncio.wait_for(call, HANG_BOUND_S)

    async def test() -> None:
        callbacks = RecordingCallbacks(NUM_PARTITIONS)
        async with WaltzClient(callbacks, waltz_client_config(cluster, **short)) as client:
            committed = MockContext("before the stop", partition=2)
            await client.submit(committed)
            await asyncio.wait_for(asyncio.wrap_future(committed.application), WAIT_S)
            # In a thread: the loop must go on running to see the connections drop.
            await asyncio.to_thread(cluster.servers[0].stop)
            try:
                await expect_timeout(client.high_water_mark(2))
                failed = MockContext("after the stop", partition=2)
                await expect_timeout(client.submit(failed))
                with pytest.raises(ClientTimeoutError):
                    await failed.result(WAIT_S)  # on_exception told the context too
                await expect_timeout(client.rpc_client.get_transaction_data(2, 0))
                # A client started while the server is down fails the same way.
                async with WaltzClient(
                    RecordingCallbacks(NUM_PARTITIONS), waltz_client_config(cluster, **short)
                ) as late:
                    await expect_timeout(late.submit(MockContext("late", partition=0)))
            finally:
                await asyncio.to_thread(cluster.servers[0].start)
        await asyncio.to_thread(cluster.wait_verified)

    run(test())
