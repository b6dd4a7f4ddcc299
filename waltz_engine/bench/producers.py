"""`waltz bench producers`: the original's ``PerformanceCli test-producers`` (reference §4.6).

``threads`` appender tasks each submit ``txns_per_thread`` transactions of ``txn_size`` bytes
to a random one of the first ``partitions`` partitions, sleeping an exponentially
distributed interval (mean ``interval_ms``) between submits, with at most ``max_in_flight``
of their transactions outstanding (the original: one WaltzClient per thread, bounded by
its ``client.maxConcurrentTransactions``, default 5). Every appender first sends one
warm-up transaction that is not measured; the timer starts when all warm-ups committed
(every partition is mounted). Latency is from ``submit`` returning (the append is sent:
client-side congestion excluded, as the original) to ``on_completion``. A retry is a
re-execution of a context (lock failure, server change).

Unlike the original, the appenders are asyncio tasks sharing ``clients`` WaltzClients
(default 1): every client is fed every transaction of its partitions, so one client per
appender makes the server send each commit ``threads`` times.

By default the benchmark brings its own cluster (a `waltz_engine.ops.devcluster.LocalCluster`:
embedded ZooKeeper, ``storages`` storage nodes, one server) and reports the CPU seconds of
each process, this one included, per 1 000 transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from waltz_engine.bench import process_cpu
from waltz_engine.bench.feed_watchers import WatchedPartition, WatcherProcess, WatchResult, WatchSpec
from waltz_engine.bench.node_counts import StorageBatches, local_http_ports, node_counts
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.bench.window import Window
from waltz_engine.client import (
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_engine.client.config import DEFAULT_MAX_CONCURRENT_TRANSACTIONS
from waltz_engine.common.loop_turns import count_turns
from waltz_engine.ops.devcluster import LocalCluster

BYTES_PER_MB = 1024 * 1024  # the original's BYTES_IN_MEGABYTE
MS_PER_S = 1000.0
TXNS_PER_CPU_FIGURE = 1000
DEFAULT_STORAGES = 3
DEFAULT_CLUSTER_PARTITIONS = 4
DEFAULT_CLIENTS = 1
LOCK_NAME = "performance_analysis_lock"  # the original's DummyTxnContext.LOCK_NAME
HIGH_WATER_MARK_NONE = -1
# The header of warm-up transactions, so a consumer can leave them out of its count.
WARM_UP_HEADER = 1
MEASURED_HEADER = 0
CLIENT_PROCESS = "client"
WATCHERS_PROCESS = "watchers"
ZOOKEEPER_PROCESS = "zookeeper"
# Generous: a saturated 2-core machine may take seconds per mount or batch.
SUBMIT_TIMEOUT_MS = 60_000
PERCENTILE_CUTS = 100  # statistics.quantiles cut points: index 49 = p50


def percentile(values: list[float], percent: int) -> float:
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=PERCENTILE_CUTS, method="inclusive")[percent - 1]


def latency_summary(latencies_ms: list[float]) -> dict[str, float]:
    return {f"p{p}_ms": round(percentile(latencies_ms, p), 3) for p in (50, 95, 99)}


def cpu_per_thousand(cpu_s: Mapping[str, float], transactions: int) -> dict[str, float]:
    return {name: round(s * TXNS_PER_CPU_FIGURE / max(transactions, 1), 4) for name, s in cpu_s.items()}


def latency_and_cpu_lines(
    label: str, latencies_ms: list[float], cpu_s: Mapping[str, float], transactions: int
) -> list[str]:
    """The report lines both client benchmarks end with: percentiles, then CPU per process."""
    lines = [
        "{label} latency ms: p50 {p50_ms:.3f} p95 {p95_ms:.3f} p99 {p99_ms:.3f}".format(
            label=label, **latency_summary(latencies_ms)
        )
    ]
    for name, per_k in cpu_per_thousand(cpu_s, transactions).items():
        lines.append(f"CPU sec/1000 transactions [{name}]: {per_k:.4f}")
    return lines


# --- a cluster ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchCluster:
    """What a benchmark needs of a cluster: the client config and the processes to watch."""

    client_config: dict[str, Any]
    pids: dict[str, int] = field(default_factory=dict)
    # Nodes' HTTP ports (a local cluster's): the servers' loop iterations and the storage nodes'
    # append requests and disk batches are counted over a run.
    http_ports: dict[str, int] = field(default_factory=dict)

    def watched_pids(self) -> dict[str, int]:
        return {**self.pids, CLIENT_PROCESS: os.getpid()}

    def node_counts(self) -> tuple[dict[str, int], dict[str, StorageBatches]]:
        """Each server's loop iterations so far, and each storage node's append requests and
        disk batches so far (:func:`node_counts`)."""
        return node_counts(self.http_ports)


def _local_cluster_pids(cluster: LocalCluster) -> dict[str, int]:
    pids = {node.name: node.pid for node in cluster.nodes if node.pid is not None and node.is_running()}
    embedded = cluster.embedded_zookeeper
    zookeeper_pid = embedded.pid() if embedded is not None else None
    if zookeeper_pid is not None:
        pids[ZOOKEEPER_PROCESS] = zookeeper_pid
    return pids


KEY_CONNECT_STRING = "zookeeper.connectString"
KEY_CLUSTER_ROOT = "cluster.root"


class RunningCluster(NamedTuple):
    """Where a running cluster is (a client YAML, and/or ZooKeeper and root that override it);
    all None: the benchmark brings its own."""

    config_path: Path | None = None
    zookeeper: str | None = None
    cluster_root: str | None = None

    @property
    def given(self) -> bool:
        return any(value is not None for value in self)


def load_cluster(
    config_path: Path | None, zookeeper: str | None = None, cluster_root: str | None = None
) -> BenchCluster:
    """A running cluster from a client YAML and/or a ZooKeeper connect string and root (which
    win over the file's). Beside a local cluster's state file (the `waltz dev` cluster's
    client.yml) the node processes are known and their CPU reported; otherwise only this
    process's."""
    loaded: Any = {}
    pids: dict[str, int] = {}
    http_ports: dict[str, int] = {}
    if config_path is not None:
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise BenchError(f"{config_path}: not YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise BenchError(f"{config_path}: expected a YAML mapping")
        directory = config_path.resolve().parent
        if LocalCluster.exists(directory):
            local = LocalCluster.open(directory)
            pids, http_ports = _local_cluster_pids(local), local_http_ports(local)
    overrides = {KEY_CONNECT_STRING: zookeeper, KEY_CLUSTER_ROOT: cluster_root}
    loaded = {**loaded, **{key: value for key, value in overrides.items() if value is not None}}
    for key, flag in ((KEY_CONNECT_STRING, "--zookeeper"), (KEY_CLUSTER_ROOT, "--cluster-root")):
        if not loaded.get(key):
            source = f"{config_path} has no '{key}'" if config_path is not None else f"no '{key}'"
            raise BenchError(f"{source}: pass {flag}, or -c with a client YAML of the running cluster")
    return BenchCluster(loaded, pids, http_ports)


@contextlib.contextmanager
def own_cluster(
    work: Path, storages: int = DEFAULT_STORAGES, partitions: int = DEFAULT_CLUSTER_PARTITIONS
) -> Iterator[BenchCluster]:
    """A local cluster (embedded ZooKeeper, ``storages`` nodes holding every partition, one
    server) under ``work``, stopped afterwards, also on SIGTERM."""
    cluster = LocalCluster(work, storages=storages, servers=1, partitions=partitions)
    with _sigterm_as_exit():
        try:
            cluster.up()
            yield load_cluster(cluster.client_config_path)
        finally:
            cluster.down()


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the nodes (in sessions of their own) are stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def bench_cluster(
    running: RunningCluster | Path | None,
    directory: Path,
    storages: int = DEFAULT_STORAGES,
    partitions: int = DEFAULT_CLUSTER_PARTITIONS,
    progress: Callable[[str], None] = lambda _: None,
) -> Iterator[BenchCluster]:
    """The running cluster (a client YAML path, or :class:`RunningCluster`), or else one of our
    own in a scratch directory under ``directory`` with at least ``partitions`` partitions
    (removed afterwards)."""
    if isinstance(running, Path):
        running = RunningCluster(running)
    if running is not None and running.given:
        yield load_cluster(*running)
        return
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="waltz-bench-cluster-", dir=directory) as work:
        progress(f"starting an embedded ZooKeeper, {storages} storage nodes and a server")
        with own_cluster(Path(work), storages, max(partitions, DEFAULT_CLUSTER_PARTITIONS)) as cluster:
            yield cluster


# --- clients --------------------------------------------------------------------------------------


class BenchCallbacks(WaltzClientCallbacks):
    """Starts each partition where ``high_water_marks`` says; ``on_apply`` sees every transaction."""

    def __init__(
        self,
        high_water_marks: Mapping[int, int],
        on_apply: Callable[[Transaction], Any] | None = None,
    ) -> None:
        self.high_water_marks = dict(high_water_marks)
        self.on_apply = on_apply

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_marks.get(partition_id, HIGH_WATER_MARK_NONE)

    def apply_transaction(self, transaction: Transaction) -> Any:
        # (``req_id.partition_id``: the ``partition_id`` property without its call)
        self.high_water_marks[transaction.req_id.partition_id] = transaction.transaction_id
        return None if self.on_apply is None else self.on_apply(transaction)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        return None


def client_config(
    cluster: BenchCluster, max_concurrent_transactions: int = DEFAULT_MAX_CONCURRENT_TRANSACTIONS
) -> WaltzClientConfig:
    # autoMount off: the bench mounts only the active partitions, at a high-water mark it chose.
    return WaltzClientConfig.from_config(
        cluster.client_config,
        auto_mount=False,
        max_concurrent_transactions=max_concurrent_transactions,
        registration_timeout_ms=SUBMIT_TIMEOUT_MS,
        flush_timeout_ms=SUBMIT_TIMEOUT_MS,
    )


async def start_client(
    config: WaltzClientConfig,
    partitions: int,
    mount_from_latest: bool,
    on_apply: Callable[[Transaction], Any] | None = None,
) -> WaltzClient:
    """A client mounted on partitions ``0 .. partitions-1``, from their current high-water
    marks when ``mount_from_latest`` (otherwise from the beginning, as the original)."""
    callbacks = BenchCallbacks({}, on_apply)
    client = await WaltzClient.create(callbacks, config)
    try:
        if partitions > client.num_partitions:
            raise BenchError(f"{partitions} active partitions, but the cluster has {client.num_partitions}")
        if mount_from_latest:
            for partition_id in range(partitions):
                callbacks.high_water_marks[partition_id] = await client.high_water_mark(partition_id)
        await client.set_partitions(range(partitions))
    except BaseException:
        await client.close()
        raise
    return client


# --- the producers --------------------------------------------------------------------------------


@dataclass
class _Stats:
    measured: bool = True  # False: warm-up transactions (not in the results, marked by header)
    retries: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)


class _TxnContext(TransactionContext):
    """The original's DummyTxnContext: fixed data, an optional random write lock."""

    def __init__(
        self, data: bytes, partition_id: int, lock_pool: int, stats: _Stats, done: Callable[[], object]
    ) -> None:
        super().__init__()
        self._data = data
        self._partition_id = partition_id
        self._lock_pool = lock_pool
        self._stats = stats
        self._done = done
        self._executions = 0
        self.sent_at: float | None = None

    def partition_id(self, num_partitions: int) -> int:
        return self._partition_id

    def execute(self, builder: TransactionBuilder) -> bool:
        self._executions += 1
        if self._executions > 1:
            self._stats.retries += 1
        builder.set_transaction_data(self._data)
        builder.set_header(MEASURED_HEADER if self._stats.measured else WARM_UP_HEADER)
        if self._lock_pool:
            builder.set_write_locks([PartitionLocalLock(LOCK_NAME, random.randrange(self._lock_pool))])
        return True

    def on_completion(self, result: bool) -> None:
        if self.sent_at is not None:
            self._stats.latencies_ms.append((time.perf_counter() - self.sent_at) * MS_PER_S)
        self._done()  # the one final outcome (the client's contract): called once

    def on_exception(self, exception: BaseException) -> None:
        # Reported after the run (with the count), not through an exception: a run that is
        # interrupted would otherwise log every pending one as never retrieved.
        self._stats.failures.append(exception)
        self._done()


@dataclass(frozen=True)
class ProducerResult:
    transactions: int
    txn_size: int
    seconds: float
    retries: int
    latencies_ms: list[float]
    cpu_s: dict[str, float]
    threads: int
    clients: int
    max_in_flight: int
    interval_ms: float
    partitions: int
    lock_pool: int
    watchers: int = 0  # feed-only connections in a process of their own (bench.feed_watchers)
    # Loop iterations (selector returns) over the measured run: each server's (a local cluster's)
    # and the clients' loop ("client").
    loop_iterations: dict[str, int] = field(default_factory=dict)
    # Each storage node's append requests and disk batches over the measured run (a local cluster's).
    storage_batches: dict[str, StorageBatches] = field(default_factory=dict)

    @property
    def megabytes(self) -> float:
        return self.transactions * self.txn_size / BYTES_PER_MB

    def report_lines(self) -> list[str]:
        """The original's five lines, then ours (percentiles, CPU per 1 000 transactions)."""
        n = max(self.transactions, 1)
        lines = [
            f"Appended {self.transactions} transactions, with total {self.megabytes:.4f} MB, "
            f"in {self.seconds:.2f} secs",
            f"Transaction/sec: {self.transactions / self.seconds:.4f}",
            f"MB/sec: {self.megabytes / self.seconds:.4f}",
            f"Retry/Transaction: {self.retries / n:.4f}",
            f"MilliSec/Transaction(client side congestion excluded): {sum(self.latencies_ms) / n:.4f}",
        ]
        lines += latency_and_cpu_lines("Commit", self.latencies_ms, self.cpu_s, self.transactions)
        for name, per_commit in self.loop_iterations_per_transaction().items():
            lines.append(f"Loop iterations per transaction ({name}): {per_commit:.2f}")
        for name, figures in self.storage_batches_per_transaction().items():
            lines.append(
                f"Storage batches [{name}]: {figures['transactions_per_append_request']:.2f} transactions "
                f"per append request, {figures['append_requests_per_disk_batch']:.2f} append requests per "
                f"disk batch, {figures['partition_batches_per_disk_pass']:.2f} partitions per disk pass"
            )
        return lines

    def storage_batches_per_transaction(self) -> dict[str, dict[str, float]]:
        return {
            name: counts.per_transaction(self.transactions)
            for name, counts in sorted(self.storage_batches.items())
        }

    def loop_iterations_per_transaction(self) -> dict[str, float]:
        n = max(self.transactions, 1)
        return {name: round(count / n, 2) for name, count in sorted(self.loop_iterations.items())}

    def to_json(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "txn_size": self.txn_size,
            "threads": self.threads,
            "clients": self.clients,
            "max_in_flight_per_thread": self.max_in_flight,
            "interval_ms": self.interval_ms,
            "partitions": self.partitions,
            "lock_pool": self.lock_pool,
            "watchers": self.watchers,
            "seconds": round(self.seconds, 3),
            "megabytes": round(self.megabytes, 4),
            "transactions_per_s": round(self.transactions / self.seconds, 2),
            "mb_per_s": round(self.megabytes / self.seconds, 4),
            "retries_per_transaction": round(self.retries / max(self.transactions, 1), 4),
            "mean_latency_ms": round(sum(self.latencies_ms) / max(self.transactions, 1), 4),
            "latency": latency_summary(self.latencies_ms),
            "cpu_s_per_1000_transactions": cpu_per_thousand(self.cpu_s, self.transactions),
            "loop_iterations_per_transaction": self.loop_iterations_per_transaction(),
            "storage_batches": self.storage_batches_per_transaction(),
        }


def _raise_failures(stats: _Stats, kind: str) -> None:
    if stats.failures:
        raise BenchError(f"{len(stats.failures)} {kind} transactions failed, first: {stats.failures[0]!r}")


def _exponential_interval_s(mean_ms: float) -> float:
    # The original's nextExponentialDistributedInterval (LAMBDA 1), in seconds.
    return mean_ms * -math.log(1.0 - random.random()) / MS_PER_S


async def _appender(
    client: WaltzClient,
    data: bytes,
    txns: int,
    partitions: int,
    lock_pool: int,
    interval_ms: float,
    max_in_flight: int,
    stats: _Stats,
    start: asyncio.Event,
) -> None:
    # The window opens in the outcome's own hook: no future, done callback or loop turn per
    # transaction between a commit and the next submit, and none kept to be gathered.
    window = Window(max_in_flight)
    await start.wait()
    for _ in range(txns):
        await window.acquire()
        partition_id = random.randrange(partitions) if partitions > 1 else 0
        context = _TxnContext(data, partition_id, lock_pool, stats, window.release)
        await client.submit(context)
        context.sent_at = time.perf_counter()  # the latency runs from submit's return
        if interval_ms > 0:
            await asyncio.sleep(_exponential_interval_s(interval_ms))
    for _ in range(max_in_flight):  # the whole window back: every transaction has its outcome
        await window.acquire()


async def warm_up(clients: list[WaltzClient], data: bytes, partitions: int) -> None:
    """One unmeasured transaction per client and partition: returns when every one committed,
    i.e. every client is mounted on every active partition."""
    loop = asyncio.get_running_loop()
    stats = _Stats(measured=False)
    waits = []
    for client in clients:
        for partition_id in range(partitions):
            done: asyncio.Future[None] = loop.create_future()
            await client.submit(_TxnContext(data, partition_id, 0, stats, partial(done.set_result, None)))
            waits.append(done)
    await asyncio.gather(*waits)
    _raise_failures(stats, "warm-up")


async def _produce(
    cluster: BenchCluster,
    *,
    txn_size: int,
    txns_per_thread: int,
    threads: int,
    interval_ms: float,
    partitions: int,
    lock_pool: int,
    clients: int,
    max_in_flight: int,
    mount_from_latest: bool,
    watchers: int = 0,
) -> ProducerResult:
    data = bytes(txn_size)
    threads_per_client = math.ceil(threads / clients)
    # Large enough that the client never holds a submit back: the appenders' window is the limit.
    config = client_config(cluster, threads_per_client * max_in_flight + partitions)
    started = [await start_client(config, partitions, mount_from_latest) for _ in range(clients)]
    watcher_process: WatcherProcess | None = None
    try:
        await warm_up(started, data, partitions)
        if watchers:
            spec = await _watch_spec(started[0], config, watchers, partitions)
            watcher_process = await WatcherProcess.start(spec)
        # What the set-up made (clients, ZooKeeper sessions) lives as long as the run: leave it
        # out of the collector's full passes, which would otherwise walk it again and again while
        # the clients' in-flight transactions churn (one process holds every client here).
        gc.freeze()
        stats = _Stats()
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(
                _appender(
                    started[index % clients],
                    data,
                    txns_per_thread,
                    partitions,
                    lock_pool,
                    interval_ms,
                    max_in_flight,
                    stats,
                    start,
                )
            )
            for index in range(threads)
        ]
        await asyncio.sleep(0)  # every appender waits on `start`
        # Before the CPU snapshot: a /metrics request (1-2 ms of each node's CPU) is not measured.
        loops_before, batches_before = await asyncio.to_thread(cluster.node_counts)
        cpu_before = process_cpu.snapshot(pids := cluster.watched_pids())
        # The clients' own loop (this process's): its iterations per commit are on the commit's path.
        client_turns = count_turns(asyncio.get_running_loop())
        client_turns_before = client_turns.count if client_turns is not None else 0
        started_s = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        watched: WatchResult | None = None
        if watcher_process is not None:
            # Measured until the watchers were fed every commit, as the clients were.
            watched = await watcher_process.finish(
                {p: await started[0].high_water_mark(p) for p in spec.partitions}
            )
        seconds = time.perf_counter() - started_s
        cpu_s = process_cpu.used_since(cpu_before, pids)
        client_turns_after = client_turns.count if client_turns is not None else 0
        loops_after, batches_after = await asyncio.to_thread(cluster.node_counts)
        storage_batches = {
            name: counts.since(batches_before[name])
            for name, counts in batches_after.items()
            if name in batches_before
        }
        loop_iterations = {
            name: count - loops_before[name] for name, count in loops_after.items() if name in loops_before
        }
        if client_turns is not None:
            loop_iterations[CLIENT_PROCESS] = client_turns_after - client_turns_before
        if watched is not None:
            cpu_s[WATCHERS_PROCESS] = watched.cpu_s
    finally:
        if watcher_process is not None:
            await watcher_process.close()
        for client in started:
            await client.close()
    _raise_failures(stats, "measured")
    fed, measured = (0 if watched is None else sum(watched.frames.values())), txns_per_thread * threads
    if fed != watchers * measured:
        raise BenchError(
            f"{watchers} watchers were fed {fed} transactions in all, not {watchers} x {measured}"
        )
    return ProducerResult(
        transactions=txns_per_thread * threads,
        txn_size=txn_size,
        seconds=seconds,
        retries=stats.retries,
        latencies_ms=stats.latencies_ms,
        cpu_s=cpu_s,
        threads=threads,
        clients=clients,
        max_in_flight=max_in_flight,
        interval_ms=interval_ms,
        partitions=partitions,
        lock_pool=lock_pool,
        watchers=watchers,
        loop_iterations=loop_iterations,
        storage_batches=storage_batches,
    )


async def _watch_spec(
    client: WaltzClient, config: WaltzClientConfig, watchers: int, partitions: int
) -> WatchSpec:
    """Watchers mounted where ``client`` is, from the current high-water marks (after the warm-up)."""
    watched = {}
    for partition_id in range(partitions):
        network_client = client.rpc_client.network_client_of(partition_id)
        if network_client is None:
            raise BenchError(f"partition {partition_id} has no server to watch")
        endpoint = config.endpoint_overrides.get(network_client.endpoint, network_client.endpoint)
        watched[partition_id] = WatchedPartition(
            endpoint, client.rpc_client.generation(partition_id), await client.high_water_mark(partition_id)
        )
    return WatchSpec(watchers, watched, dataclasses.asdict(config.tls))


def run(
    cluster: BenchCluster,
    *,
    txn_size: int,
    txns_per_thread: int,
    threads: int,
    interval_ms: float,
    partitions: int = 1,
    lock_pool: int = 0,
    clients: int = DEFAULT_CLIENTS,
    max_in_flight: int = DEFAULT_MAX_CONCURRENT_TRANSACTIONS,
    mount_from_latest: bool = False,
    watchers: int = 0,
) -> ProducerResult:
    if min(txns_per_thread, threads, partitions, clients, max_in_flight) < 1:
        raise BenchError("transactions, threads, partitions, clients and in-flight must be positive")
    if txn_size < 0 or interval_ms < 0 or lock_pool < 0 or watchers < 0:
        raise BenchError("txn size, interval, lock pool and watchers must not be negative")
    return asyncio.run(
        _produce(
            cluster,
            txn_size=txn_size,
            txns_per_thread=txns_per_thread,
            threads=threads,
            interval_ms=interval_ms,
            partitions=partitions,
            lock_pool=lock_pool,
            clients=min(clients, threads),
            max_in_flight=max_in_flight,
            mount_from_latest=mount_from_latest,
            watchers=watchers,
        )
    )
