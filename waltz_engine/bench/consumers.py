"""`waltz bench consumers`: the original's ``PerformanceCli test-consumers`` (reference §4.6).

Produces ``txns`` transactions of ``txn_size`` bytes over the first ``partitions``
partitions (up to 100 appenders, as the original's producer threads), waits until all
committed, then a fresh client mounts those partitions just before them and reads every
one, fetching its data by RPC in ``apply_transaction``. The timer runs from the first
``apply_transaction`` to the last; the data fetch latency is the time ``data()`` waited (zero
when the client had asked ahead and the answer was there). The fetch pipeline's depth is the
number of transactions whose data the client had asked for ahead (answered or in flight) when
each ``data()`` was called (``client.dataPrefetchBytes``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waltz_engine.bench import process_cpu
from waltz_engine.bench.producers import (
    BYTES_PER_MB,
    MS_PER_S,
    WARM_UP_HEADER,
    BenchCluster,
    client_config,
    cpu_per_thousand,
    latency_and_cpu_lines,
    latency_summary,
    start_client,
)
from waltz_engine.bench.producers import run as run_producers
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.client import Transaction

MAX_PRODUCER_THREADS = 100  # the original's DEFAULT_NUM_PRODUCERS
PRODUCER_IN_FLIGHT = 1


@dataclass(frozen=True)
class ConsumerResult:
    transactions: int
    txn_size: int
    seconds: float
    fetch_latencies_ms: list[float]
    cpu_s: dict[str, float]
    partitions: int
    pipeline_depths: list[int]
    prefetch_bytes: int

    @property
    def megabytes(self) -> float:
        return self.transactions * self.txn_size / BYTES_PER_MB

    def report_lines(self) -> list[str]:
        lines = [
            f"Read {self.transactions} transactions, with total {self.megabytes:.4f} MB, "
            f"in {self.seconds:.2f} secs",
            f"Transaction/sec: {self.transactions / self.seconds:.4f}",
            f"MB/sec: {self.megabytes / self.seconds:.4f}",
        ]
        depth = self.depth_summary()
        lines.append(
            f"Fetch pipeline depth: mean {depth['mean']}, p50 {depth['p50']}, max {depth['max']} "
            f"(client.dataPrefetchBytes {self.prefetch_bytes})"
        )
        return lines + latency_and_cpu_lines(
            "Data fetch", self.fetch_latencies_ms, self.cpu_s, self.transactions
        )

    def depth_summary(self) -> dict[str, float]:
        depths = self.pipeline_depths or [0]
        return {
            "mean": round(statistics.fmean(depths), 1),
            "p50": statistics.median_low(depths),
            "max": max(depths),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "txn_size": self.txn_size,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 3),
            "megabytes": round(self.megabytes, 4),
            "transactions_per_s": round(self.transactions / self.seconds, 2),
            "mb_per_s": round(self.megabytes / self.seconds, 4),
            "fetch_latency": latency_summary(self.fetch_latencies_ms),
            "fetch_pipeline_depth": self.depth_summary(),
            "data_prefetch_bytes": self.prefetch_bytes,
            "cpu_s_per_1000_transactions": cpu_per_thousand(self.cpu_s, self.transactions),
        }


class _Reader:
    """apply_transaction of the consumer: fetch the data, time it, count down."""

    def __init__(self, txns: int, high_water_marks: dict[int, int], done: asyncio.Future[None]) -> None:
        self.remaining = txns
        self.first_at: float | None = None
        self.last_at = 0.0
        self.fetch_ms: list[float] = []
        self.depths: list[int] = []
        # The client's data asked ahead of a partition (set once the client exists).
        self.depth_of: Callable[[int], int] | None = None
        self._start_marks = high_water_marks
        self._done = done

    async def apply(self, transaction: Transaction) -> None:
        if transaction.header == WARM_UP_HEADER or transaction.transaction_id <= self._start_marks.get(
            transaction.partition_id, -1
        ):
            return  # a producer's warm-up, or older than this run (an existing cluster)
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        if self.depth_of is not None:
            self.depths.append(self.depth_of(transaction.partition_id))
        await transaction.data()
        self.last_at = time.perf_counter()
        self.fetch_ms.append((self.last_at - now) * MS_PER_S)
        self.remaining -= 1
        if self.remaining == 0 and not self._done.done():
            self._done.set_result(None)


async def _consume(
    cluster: BenchCluster, txns: int, txn_size: int, partitions: int, start_marks: dict[int, int]
) -> ConsumerResult:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reader = _Reader(txns, start_marks, done)
    pids = cluster.watched_pids()
    cpu_before = process_cpu.snapshot(pids)
    config = client_config(cluster)
    consumer = await start_client(config, partitions, mount_from_latest=False, on_apply=reader.apply)
    reader.depth_of = consumer.rpc_client.prefetch_depth
    try:
        await done
    finally:
        await consumer.close()
    cpu_s = process_cpu.used_since(cpu_before, pids)
    assert reader.first_at is not None
    return ConsumerResult(
        txns,
        txn_size,
        reader.last_at - reader.first_at,
        reader.fetch_ms,
        cpu_s,
        partitions,
        reader.depths,
        config.data_prefetch_bytes,
    )


async def _high_water_marks(cluster: BenchCluster, partitions: int) -> dict[int, int]:
    client = await start_client(client_config(cluster), 0, mount_from_latest=False)
    try:
        return {p: await client.high_water_mark(p) for p in range(partitions)}
    finally:
        await client.close()


def run(cluster: BenchCluster, *, txn_size: int, txns: int, partitions: int = 1) -> ConsumerResult:
    if txns < 1 or partitions < 1 or txn_size < 0:
        raise BenchError("transactions and partitions must be positive, txn size not negative")
    start_marks = asyncio.run(_high_water_marks(cluster, partitions))
    threads = min(MAX_PRODUCER_THREADS, txns)
    per_thread, extra = divmod(txns, threads)
    run_producers(
        cluster,
        txn_size=txn_size,
        txns_per_thread=per_thread,
        threads=threads,
        interval_ms=0,
        partitions=partitions,
        max_in_flight=PRODUCER_IN_FLIGHT,
    )
    if extra:
        run_producers(
            cluster, txn_size=txn_size, txns_per_thread=extra, threads=1, interval_ms=0, partitions=partitions
        )
    return asyncio.run(_consume(cluster, txns, txn_size, partitions, start_marks))
