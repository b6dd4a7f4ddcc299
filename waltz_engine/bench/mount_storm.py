"""`waltz bench producers --mount-storm N`: N clients mount the same partitions at once.

The original's consumer tool starts a hundred WaltzClients together, each mounting partition 0
from its own high-water mark; a server that serves mounts one at a time, or lets one catching-up
client hold the others back, times them out (the Java client gives up after 10 s). Here:

1. a backlog of ``threads × txns_per_thread`` transactions is committed (a normal producers run
   with one client, not reported);
2. N WaltzClients are started (a client id and a ZooKeeper session each) and connected, before
   the clock starts;
3. one more client keeps appending with ``threads`` appenders (``max_in_flight`` each) from
   before the storm until every client is mounted: mounts must not stall the append path;
4. at one instant every client activates the first ``partitions`` partitions, from the beginning
   (each mount then feeds it the whole backlog before READY, as the original's consumers) or,
   with ``mount_from_latest``, from the current high-water marks;
5. each client's mount time runs from that instant until it is mounted on all of them.

Reported: the time until all are mounted, p50/p99/max of the mount times, mounts slower than
the client's default mount timeout, the commits/s of the appenders during the storm, and the
CPU seconds of every process during the storm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from waltz_engine.bench import process_cpu
from waltz_engine.bench.producers import (
    HIGH_WATER_MARK_NONE,
    MEASURED_HEADER,
    MS_PER_S,
    SUBMIT_TIMEOUT_MS,
    BenchCallbacks,
    BenchCluster,
    client_config,
    percentile,
    start_client,
)
from waltz_engine.bench.producers import run as run_producers
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.client import TransactionBuilder, TransactionContext, WaltzClient
from waltz_engine.client.config import DEFAULT_MAX_CONCURRENT_TRANSACTIONS, ENSURE_MOUNTED_TIMEOUT_MS

# Clients started at the same time before the storm (each opens a ZooKeeper session and takes
# a client id): enough to start hundreds in seconds without a storm of ZooKeeper sessions.
CLIENT_START_CONCURRENCY = 16
CONNECTED_POLL_INTERVAL_S = 0.05
# Every client's stream connection is up within this, or the benchmark gives up.
CONNECT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class MountStormResult:
    clients: int
    partitions: int
    backlog_transactions: int
    mount_from_latest: bool
    seconds_all_mounted: float
    mount_ms: list[float]
    failures: int
    first_failure: str | None
    cpu_s: dict[str, float]
    load_commits: int = 0

    @property
    def load_commits_per_s(self) -> float:
        return self.load_commits / self.seconds_all_mounted if self.seconds_all_mounted > 0 else 0.0

    @property
    def mounted(self) -> int:
        return len(self.mount_ms)

    @property
    def over_client_timeout(self) -> int:
        """Mounts a client with the default mount timeout (the original's 10 s) gave up on."""
        return sum(1 for ms in self.mount_ms if ms > ENSURE_MOUNTED_TIMEOUT_MS) + self.failures

    def latency(self) -> dict[str, float]:
        return {
            "p50_ms": round(percentile(self.mount_ms, 50), 3),
            "p99_ms": round(percentile(self.mount_ms, 99), 3),
            "max_ms": round(max(self.mount_ms, default=float("nan")), 3),
        }

    def report_lines(self) -> list[str]:
        start = "their high-water marks" if self.mount_from_latest else "the beginning"
        latency = self.latency()
        lines = [
            f"Mounted {self.mounted} of {self.clients} clients on {self.partitions} partition(s) "
            f"from {start} (backlog {self.backlog_transactions} transactions) "
            f"in {self.seconds_all_mounted:.3f} secs",
            "Mount latency ms: p50 {p50_ms:.3f} p99 {p99_ms:.3f} max {max_ms:.3f}".format(**latency),
            f"Mounts beyond the client's {ENSURE_MOUNTED_TIMEOUT_MS} ms mount timeout: "
            f"{self.over_client_timeout}",
        ]
        lines.append(
            f"Appends committed during the storm: {self.load_commits} ({self.load_commits_per_s:.1f}/sec)"
        )
        if self.first_failure is not None:
            lines.append(f"Failed mounts: {self.failures}, first: {self.first_failure}")
        for name, seconds in self.cpu_s.items():
            lines.append(f"CPU sec during the storm [{name}]: {seconds:.3f}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "mount_storm_clients": self.clients,
            "partitions": self.partitions,
            "backlog_transactions": self.backlog_transactions,
            "mount_from_latest": self.mount_from_latest,
            "mounted": self.mounted,
            "failures": self.failures,
            "first_failure": self.first_failure,
            "over_client_mount_timeout": self.over_client_timeout,
            "seconds_all_mounted": round(self.seconds_all_mounted, 3),
            "mount_latency": self.latency(),
            "load_commits": self.load_commits,
            "load_commits_per_s": round(self.load_commits_per_s, 2),
            "cpu_s_during_storm": {name: round(s, 3) for name, s in self.cpu_s.items()},
        }


async def _start_clients(cluster: BenchCluster, clients: int) -> list[tuple[WaltzClient, BenchCallbacks]]:
    # Mounts slower than the client's default timeout are counted, not failed: the bound is generous.
    config = dataclasses.replace(client_config(cluster), ensure_mounted_timeout_ms=SUBMIT_TIMEOUT_MS)
    slots = asyncio.Semaphore(CLIENT_START_CONCURRENCY)
    started: list[tuple[WaltzClient, BenchCallbacks]] = []

    async def start_one() -> None:
        async with slots:
            callbacks = BenchCallbacks({})
            started.append((await WaltzClient.create(callbacks, config), callbacks))

    results = await asyncio.gather(*(start_one() for _ in range(clients)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await _close_all(client for client, _ in started)
        raise BenchError(f"{len(errors)} of {clients} clients could not start, first: {errors[0]}")
    return started


class _LoadContext(TransactionContext):
    """One append of the load: ``txn_size`` zero bytes to a random active partition."""

    def __init__(self, data: bytes, partition_id: int, done: asyncio.Future[bool]) -> None:
        super().__init__()
        self._data = data
        self._partition_id = partition_id
        self._done = done

    def partition_id(self, num_partitions: int) -> int:
        return self._partition_id

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_transaction_data(self._data)
        builder.set_header(MEASURED_HEADER)
        return True

    def on_completion(self, result: bool) -> None:
        if not self._done.done():
            self._done.set_result(result)

    def on_exception(self, exception: BaseException) -> None:
        if not self._done.done():
            self._done.set_result(False)


class _Load:
    """Appenders that keep one client appending until stopped, counting commits."""

    def __init__(self, client: WaltzClient, data: bytes, partitions: int, threads: int, max_in_flight: int):
        self.client = client
        self.data = data
        self.partitions = partitions
        self.committed = 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._appender(max_in_flight)) for _ in range(threads)]

    async def _appender(self, max_in_flight: int) -> None:
        loop = asyncio.get_running_loop()
        window = asyncio.Semaphore(max_in_flight)
        pending: set[asyncio.Future[bool]] = set()

        def completed(done: asyncio.Future[bool]) -> None:
            pending.discard(done)
            window.release()
            if done.result():
                self.committed += 1

        while not self._stop.is_set():
            await window.acquire()
            done: asyncio.Future[bool] = loop.create_future()
            done.add_done_callback(completed)
            pending.add(done)
            partition_id = random.randrange(self.partitions)
            await self.client.submit(_LoadContext(self.data, partition_id, done))
        if pending:
            await asyncio.wait(pending)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _close_all(clients: Iterable[WaltzClient]) -> None:
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def _wait_connected(clients: list[WaltzClient], partitions: int) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while not all(c.stream_connected(p) for c in clients for p in range(partitions)):
        if time.monotonic() > deadline:
            raise BenchError(f"the clients' connections were not all up within {CONNECT_TIMEOUT_S:.0f} s")
        await asyncio.sleep(CONNECTED_POLL_INTERVAL_S)


async def _storm(
    cluster: BenchCluster,
    clients: int,
    partitions: int,
    mount_from_latest: bool,
    load_txn_size: int,
    load_threads: int,
    load_max_in_flight: int,
) -> MountStormResult:
    started = await _start_clients(cluster, clients)
    first = started[0][0]
    load_client: WaltzClient | None = None
    try:
        config = client_config(cluster, load_threads * load_max_in_flight + partitions)
        load_client = await start_client(config, partitions, mount_from_latest=True)
        if partitions > first.num_partitions:
            raise BenchError(f"{partitions} active partitions, but the cluster has {first.num_partitions}")
        high_water_marks = {p: await first.high_water_mark(p) for p in range(partitions)}
        await _wait_connected([client for client, _ in started], partitions)
        starts = (
            high_water_marks if mount_from_latest else dict.fromkeys(high_water_marks, HIGH_WATER_MARK_NONE)
        )
        load = _Load(load_client, bytes(load_txn_size), partitions, load_threads, load_max_in_flight)
        gc.freeze()  # the clients' set-up lives as long as the run (as in producers)
        pids = cluster.watched_pids()
        cpu_before = process_cpu.snapshot(pids)
        commits_before = load.committed
        storm_start = time.perf_counter()

        async def mount(client: WaltzClient, callbacks: BenchCallbacks) -> float:
            callbacks.high_water_marks.update(starts)
            await client.set_partitions(range(partitions))
            for partition_id in range(partitions):
                await client.ensure_mounted(partition_id)
            return (time.perf_counter() - storm_start) * MS_PER_S

        results = await asyncio.gather(
            *(mount(*started_client) for started_client in started), return_exceptions=True
        )
        seconds = time.perf_counter() - storm_start
        load_commits = load.committed - commits_before
        cpu_s = process_cpu.used_since(cpu_before, pids)
        await load.stop()
    finally:
        await _close_all([client for client, _ in started] + ([load_client] if load_client else []))
    mount_ms = [r for r in results if isinstance(r, float)]
    errors = [r for r in results if isinstance(r, BaseException)]
    return MountStormResult(
        clients=clients,
        partitions=partitions,
        backlog_transactions=sum(hwm + 1 for hwm in high_water_marks.values()),
        mount_from_latest=mount_from_latest,
        seconds_all_mounted=seconds,
        mount_ms=mount_ms,
        failures=len(errors),
        first_failure=f"{type(errors[0]).__name__}: {errors[0]}" if errors else None,
        cpu_s=cpu_s,
        load_commits=load_commits,
    )


def run(
    cluster: BenchCluster,
    *,
    clients: int,
    partitions: int = 1,
    backlog_txn_size: int = 512,
    backlog_txns_per_thread: int = 1000,
    backlog_threads: int = 1,
    max_in_flight: int = DEFAULT_MAX_CONCURRENT_TRANSACTIONS,
    mount_from_latest: bool = False,
) -> MountStormResult:
    """The backlog's size and the load during the storm are a producers run's: ``backlog_threads``
    appenders of ``max_in_flight`` transactions of ``backlog_txn_size`` bytes."""
    if min(clients, partitions, backlog_threads, backlog_txns_per_thread) < 1:
        raise BenchError("clients, partitions, threads and transactions must be positive")
    run_producers(
        cluster,
        txn_size=backlog_txn_size,
        txns_per_thread=backlog_txns_per_thread,
        threads=backlog_threads,
        interval_ms=0,
        partitions=partitions,
        max_in_flight=max_in_flight,
    )
    return asyncio.run(
        _storm(
            cluster, clients, partitions, mount_from_latest, backlog_txn_size, backlog_threads, max_in_flight
        )
    )
