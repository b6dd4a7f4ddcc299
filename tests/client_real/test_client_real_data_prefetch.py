"""Transaction data asked for ahead of apply_transaction (issue 14.2), against real nodes.

ZooKeeper (the session's), 1 storage node and 1 server over TLS. A writer commits transactions
of known data; readers start from before them and check, in apply_transaction, the data and the
order, and how far ahead the client had asked (``RpcClient.prefetch_depth``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import module_cluster, waltz_client_config

from waltz_engine.client import Transaction, WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_engine.ops.devcluster import LocalCluster

NUM_PARTITIONS = 2
P0, P1 = 0, 1
TEST_BOUND_S = 120.0
RESULT_WAIT_S = 60.0
NUM_TRANSACTIONS = 300
DATA_SIZE_BYTES = 1000
# Room for about 20 transactions of DATA_SIZE_BYTES: a window far shorter than the run.
PREFETCH_BUDGET_BYTES = 20 * DATA_SIZE_BYTES
FAIL_ONCE_AT = 120  # the reader's apply_transaction raises once here: reconnect and remount


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(test, TEST_BOUND_S))


def payload(i: int) -> str:
    return f"{i:08d}".ljust(DATA_SIZE_BYTES, "x")


cluster = module_cluster(storages=1, partitions=NUM_PARTITIONS)


@pytest.fixture(scope="module")
def written(cluster: LocalCluster) -> dict[int, int]:
    """NUM_TRANSACTIONS of payload(i) on each partition; the txid of payload(0) per partition."""

    async def write() -> dict[int, int]:
        config = waltz_client_config(cluster)
        async with WaltzClient(MockCallbacks(), replace(config, auto_mount=False)) as probe:
            marks = {p: await probe.high_water_mark(p) for p in range(NUM_PARTITIONS)}
        async with WaltzClient(MockCallbacks(marks), config) as writer:
            contexts = [
                MockContext(payload(i), partition=p)
                for p in range(NUM_PARTITIONS)
                for i in range(NUM_TRANSACTIONS)
            ]
            for context in contexts:
                await writer.submit(context)
            assert [await c.result(RESULT_WAIT_S) for c in contexts] == [True] * len(contexts)
        return {p: mark + 1 for p, mark in marks.items()}

    return asyncio.run(asyncio.wait_for(write(), TEST_BOUND_S))


class Reader(WaltzClientCallbacks):
    """Reads partition P0 from before the written run; every other partition is skipped."""

    def __init__(self, first: dict[int, int], read_every: int = 1, fail_at: int | None = None) -> None:
        self.first = first
        self.read_every = read_every  # the data of every n-th transaction is read (0: none)
        self.fail_at = fail_at
        self.marks = {p: first[p] - 1 for p in first}
        self.data: list[str] = []
        self.txids: list[int] = []
        self.depths: list[int] = []
        self.client: WaltzClient | None = None
        self.done = asyncio.Event()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.marks[partition_id]

    async def apply_transaction(self, transaction: Transaction) -> None:
        partition_id = transaction.partition_id
        if partition_id != P0:
            self.marks[partition_id] = transaction.transaction_id
            return
        index = transaction.transaction_id - self.first[P0]
        if index == self.fail_at:
            self.fail_at = None
            raise RuntimeError("once")
        assert self.client is not None
        self.depths.append(self.client.rpc_client.prefetch_depth(P0))
        if self.read_every and index % self.read_every == 0:
            self.data.append((await transaction.data()).decode())
        self.txids.append(transaction.transaction_id)
        self.marks[P0] = transaction.transaction_id
        if index == NUM_TRANSACTIONS - 1:
            self.done.set()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        pass  # the one planned failure


async def read(config: WaltzClientConfig, reader: Reader) -> None:
    async with WaltzClient(reader, config) as client:
        reader.client = client
        await asyncio.wait_for(reader.done.wait(), RESULT_WAIT_S)
    assert reader.txids == [reader.first[P0] + i for i in range(NUM_TRANSACTIONS)], "in order, each once"


def test_data_is_asked_ahead_within_the_budget(cluster: LocalCluster, written: dict[int, int]) -> None:
    reader = Reader(written)
    config = waltz_client_config(cluster, data_prefetch_bytes=PREFETCH_BUDGET_BYTES)
    run(read(config, reader))
    assert reader.data == [payload(i) for i in range(NUM_TRANSACTIONS)]
    # Asked ahead (many in flight, not one round trip each), never past the byte budget.
    assert max(reader.depths) > 1
    assert max(reader.depths) <= PREFETCH_BUDGET_BYTES // DATA_SIZE_BYTES


def test_prefetch_off_asks_one_at_a_time(cluster: LocalCluster, written: dict[int, int]) -> None:
    reader = Reader(written)
    run(read(waltz_client_config(cluster, data_prefetch_bytes=0), reader))
    assert reader.data == [payload(i) for i in range(NUM_TRANSACTIONS)]
    assert set(reader.depths) == {0}


def test_remount_mid_stream_keeps_data_correct_and_in_order(
    cluster: LocalCluster, written: dict[int, int]
) -> None:
    # apply_transaction raises once: the client drops the connection, mounts again from its
    # high-water mark and is fed the rest, while requests asked ahead were in flight.
    reader = Reader(written, fail_at=FAIL_ONCE_AT)
    config = waltz_client_config(cluster, data_prefetch_bytes=PREFETCH_BUDGET_BYTES, reconnect_delay_ms=10)
    run(read(config, reader))
    assert reader.fail_at is None
    assert reader.data == [payload(i) for i in range(NUM_TRANSACTIONS)]
    assert max(reader.depths) <= PREFETCH_BUDGET_BYTES // DATA_SIZE_BYTES


def test_transactions_whose_data_is_never_read(cluster: LocalCluster, written: dict[int, int]) -> None:
    config = waltz_client_config(cluster, data_prefetch_bytes=PREFETCH_BUDGET_BYTES)
    headers_only = Reader(written, read_every=0)
    run(read(config, headers_only))
    assert set(headers_only.depths) == {0}, "an application that reads no data gets none asked for it"
    # Some read, some not: the skipped ones' answers are let go of, the read ones are right.
    some = Reader(written, read_every=3)
    run(read(config, some))
    assert some.data == [payload(i) for i in range(0, NUM_TRANSACTIONS, 3)]
    assert max(some.depths) <= PREFETCH_BUDGET_BYTES // DATA_SIZE_BYTES
