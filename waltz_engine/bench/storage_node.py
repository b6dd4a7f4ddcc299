"""`waltz bench storage`: appends to a storage node over TLS beside a raw write+fsync loop.

One data-port connection sends APPEND requests of ``records_per_request`` 1 KiB records,
with up to ``in_flight`` requests outstanding (the client pipelines by sequence number; the
node fsyncs once per request). Request latency is measured from sending to the SUCCESS
answer. In alternating rounds, the raw loop of `waltz bench engine` writes the same bytes per
request to one file and fsyncs, as many times, on the same disk: the ratio node/raw shows
what the node (TLS, framing, decoding, the engine) costs on top of the disk's sync latency.

By default the benchmark brings its own cluster: an embedded ZooKeeper (Java) and one
`waltz storage start` process in a scratch directory, both stopped at the end. Given a
ZooKeeper cluster and a node's addresses, it measures that node instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from waltz_engine.bench.engine_bench import (
    BYTES_PER_MB,
    PAYLOAD_POOL_SIZE,
    RECORD_DATA_BYTES,
    ROUNDS,
    LoopResult,
    RawLoop,
    make_payloads,
)
from waltz_engine.common.address import HostPort
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.ops.devcluster.nodes import free_port
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.admin_ops import StorageContext
from waltz_engine.storage.client import StorageClient, encode_append_records
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.server import EmbeddedZooKeeper
from waltz_engine.zk.store_metadata import issue_store_sessions

DEFAULT_RECORDS_PER_REQUEST = 100
DEFAULT_IN_FLIGHT = 8
DEFAULT_SECONDS = 5.0
# Not measured: the first requests pay for TLS session caches, the node's first segment, etc.
WARMUP_REQUESTS = 10
BENCH_SESSION_ID = 1
BENCH_CLIENT_ID = 1
NUM_PARTITIONS = 1
PARTITION_ID = 0
NODE_HOST = "127.0.0.1"
NODE_READY_TIMEOUT_S = 60.0
NODE_STOP_TIMEOUT_S = 30.0
READY_POLL_INTERVAL_S = 0.2
ZK_SESSION_TIMEOUT_MS = 30_000
REQUEST_TIMEOUT_MS = 60_000
PERCENTILES = 100  # statistics.quantiles cut points: index 49 = p50, 98 = p99


class BenchError(WaltzError):
    pass


@dataclass(frozen=True)
class NodeResult:
    records: int
    requests: int
    seconds: float
    latencies_ms: tuple[float, ...]

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.records * RECORD_DATA_BYTES / self.seconds / BYTES_PER_MB

    def percentile_ms(self, percent: int) -> float:
        assert 1 <= percent <= PERCENTILES - 1
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else float("nan")
        return statistics.quantiles(self.latencies_ms, n=PERCENTILES, method="inclusive")[percent - 1]


@dataclass(frozen=True)
class StorageBenchResult:
    node: NodeResult
    raw: LoopResult
    records_per_request: int
    in_flight: int
    node_started_by_bench: bool

    @property
    def ratio(self) -> float:
        """Node records/s over raw records/s (1.0 = as fast as the disk allows)."""
        return self.node.records_per_s / self.raw.records_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "records_per_request": self.records_per_request,
            "record_bytes": RECORD_DATA_BYTES,
            "in_flight": self.in_flight,
            "tls": True,
            "node_started_by_bench": self.node_started_by_bench,
            "node": {
                "records": self.node.records,
                "requests": self.node.requests,
                "seconds": round(self.node.seconds, 3),
                "records_per_s": round(self.node.records_per_s, 1),
                "mb_per_s": round(self.node.mb_per_s, 3),
                "latency_p50_ms": round(self.node.percentile_ms(50), 3),
                "latency_p99_ms": round(self.node.percentile_ms(99), 3),
            },
            "raw": {
                "records": self.raw.records,
                "seconds": round(self.raw.seconds, 3),
                "records_per_s": round(self.raw.records_per_s, 1),
                "mb_per_s": round(self.raw.mb_per_s, 3),
            },
            "ratio": round(self.ratio, 3),
        }


@dataclass(frozen=True)
class NodeTarget:
    """Where the appends go: a data port, the admin port (to assign the partition) and OPEN's values."""

    address: HostPort
    admin_port: int
    context: StorageContext
    partition_id: int = PARTITION_ID


# --- the appending loop ------------------------------------------------------------------------


class _Appender:
    """One connection; batches of consecutive txids; at most ``in_flight`` outstanding."""

    def __init__(self, client: StorageClient, partition_id: int, first_txid: int, records_per_request: int):
        self.client = client
        self.partition_id = partition_id
        self.next_txid = first_txid
        self.records_per_request = records_per_request
        self.pool = make_payloads()

    def _encoded_batch(self) -> bytes:
        first = self.next_txid
        records = []
        for txid in range(first, first + self.records_per_request):
            data, checksum = self.pool[txid % PAYLOAD_POOL_SIZE]
            req_id = ReqId(BENCH_CLIENT_ID, 1, self.partition_id, txid & 0x7FFFFFFF)
            records.append(Record(txid, req_id, 0, data, checksum))
        self.next_txid += self.records_per_request
        return encode_append_records(records)

    async def run(self, requests: int | None, seconds: float | None, in_flight: int) -> NodeResult:
        """Send until ``requests`` were sent or ``seconds`` passed; wait for every answer."""
        assert (requests is None) != (seconds is None) and in_flight >= 1
        window = asyncio.Semaphore(in_flight)
        latencies: list[float] = []
        pending: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []

        async def send(encoded: bytes) -> None:
            started = time.perf_counter()
            try:
                await self.client.append_encoded(
                    BENCH_SESSION_ID, self.partition_id, encoded, self.records_per_request
                )
                latencies.append((time.perf_counter() - started) * 1000)
            except BaseException as e:  # surfaced after the loop: a failed append ends the run
                failures.append(e)
                raise
            finally:
                window.release()

        started_s = time.perf_counter()
        sent = 0

        def more() -> bool:
            if failures:
                return False
            if requests is not None:
                return sent < requests
            assert seconds is not None
            return time.perf_counter() - started_s < seconds

        while more():
            encoded = self._encoded_batch()
            await window.acquire()
            task = asyncio.create_task(send(encoded))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        await asyncio.gather(*pending, return_exceptions=True)
        elapsed_s = time.perf_counter() - started_s
        if failures:
            raise BenchError(f"append to {self.client.endpoint} failed: {failures[0]}")
        return NodeResult(sent * self.records_per_request, sent, elapsed_s, tuple(latencies))


def _combine(results: list[NodeResult]) -> NodeResult:
    return NodeResult(
        sum(r.records for r in results),
        sum(r.requests for r in results),
        sum(r.seconds for r in results),
        tuple(x for r in results for x in r.latencies_ms),
    )


async def _measure(
    target: NodeTarget,
    raw: RawLoop,
    *,
    seconds: float | None,
    requests: int | None,
    records_per_request: int,
    in_flight: int,
    progress: Callable[[str], None],
) -> tuple[NodeResult, LoopResult]:
    context = target.context
    admin = StorageAdminClient(
        target.address.host, target.admin_port, context.ssl_context, context.key, context.num_partitions
    )
    await admin.open(context.timeout_ms)
    try:
        await admin.set_partition_assignment([target.partition_id], True, False)
        await admin.set_partition_available([target.partition_id], True)
    finally:
        await admin.close()
    client = StorageClient(
        target.address.host,
        target.address.port,
        context.ssl_context,
        context.key,
        context.num_partitions,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    await client.open(context.timeout_ms)
    try:
        # Continue after whatever the partition holds, so an existing node can be measured twice.
        # LAST_SESSION_INFO opens the session on the node (a read alone would not move it).
        await client.last_session_info(BENCH_SESSION_ID, target.partition_id)
        first_txid = await client.max_transaction_id(BENCH_SESSION_ID, target.partition_id) + 1
        appender = _Appender(client, target.partition_id, first_txid, records_per_request)
        progress(f"warm-up: {WARMUP_REQUESTS} requests")
        await appender.run(WARMUP_REQUESTS, None, in_flight)
        node_rounds, raw_rounds = [], []
        for round_number in range(1, ROUNDS + 1):
            progress(f"round {round_number}/{ROUNDS}: node appends, then raw write+fsync")
            node_rounds.append(
                await appender.run(
                    None if requests is None else max(1, requests // ROUNDS),
                    None if seconds is None else seconds / ROUNDS,
                    in_flight,
                )
            )
            raw_rounds.append(raw.run(node_rounds[-1].requests))
    finally:
        await client.close()
    return _combine(node_rounds), LoopResult(
        sum(r.records for r in raw_rounds), sum(r.seconds for r in raw_rounds)
    )


def run(
    target: NodeTarget,
    raw_directory: Path,
    *,
    seconds: float | None = None,
    requests: int | None = None,
    records_per_request: int = DEFAULT_RECORDS_PER_REQUEST,
    in_flight: int = DEFAULT_IN_FLIGHT,
    node_started_by_bench: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> StorageBenchResult:
    """Measure a running node; the raw loop writes in a scratch file under ``raw_directory``."""
    if seconds is None and requests is None:
        seconds = DEFAULT_SECONDS
    if records_per_request < 1 or in_flight < 1:
        raise BenchError("records per request and requests in flight must be positive")
    work = raw_directory / f"waltz-bench-storage-raw-{os.getpid()}"
    work.mkdir(parents=True)
    raw = RawLoop(work, records_per_request)
    try:
        node, raw_result = asyncio.run(
            _measure(
                target,
                raw,
                seconds=seconds,
                requests=requests,
                records_per_request=records_per_request,
                in_flight=in_flight,
                progress=progress,
            )
        )
    finally:
        raw.close()
        shutil.rmtree(work)
    return StorageBenchResult(node, raw_result, records_per_request, in_flight, node_started_by_bench)


# --- a node of our own -------------------------------------------------------------------------------


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=NODE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=NODE_STOP_TIMEOUT_S)


async def _probe(target: NodeTarget) -> None:
    context = target.context
    admin = StorageAdminClient(
        target.address.host, target.admin_port, context.ssl_context, context.key, context.num_partitions
    )
    await admin.open(context.timeout_ms)
    await admin.close()


def _wait_ready(process: subprocess.Popen[bytes], target: NodeTarget, log_path: Path) -> None:
    deadline = time.monotonic() + NODE_READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
            raise BenchError(f"storage node exited with {process.returncode}: {' '.join(tail)}")
        with contextlib.suppress(WaltzError, OSError):
            asyncio.run(_probe(target))
            return
        if time.monotonic() > deadline:
            raise BenchError(f"storage node not ready within {NODE_READY_TIMEOUT_S:.0f} s (log: {log_path})")
        time.sleep(READY_POLL_INTERVAL_S)


@contextlib.contextmanager
def own_node(work: Path, ssl_context: ssl.SSLContext) -> Iterator[NodeTarget]:
    """An embedded ZooKeeper, a 1-partition cluster and one storage node under ``work``."""
    zookeeper = EmbeddedZooKeeper(work / "zookeeper", free_port())
    zookeeper.start()
    try:
        root = f"/waltz-bench-{uuid.uuid4().hex[:8]}"
        with connect(ZooKeeperSettings(zookeeper.connect_string, root)) as client:
            params = create_cluster(client, root, "bench", NUM_PARTITIONS)
            issue_store_sessions(client, root, NUM_PARTITIONS, BENCH_SESSION_ID)
        port, admin_port = free_port(), free_port()
        config = {
            "storage.host": NODE_HOST,
            "storage.port": port,
            "storage.admin.port": admin_port,
            "storage.directory": str(work / "storage"),
            "zookeeper.connectString": zookeeper.connect_string,
            "zookeeper.sessionTimeout": ZK_SESSION_TIMEOUT_MS,
            "cluster.root": root,
        }
        config_path, log_path = work / "storage.yml", work / "storage.log"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        target = NodeTarget(
            HostPort(NODE_HOST, port),
            admin_port,
            StorageContext(params.key, params.num_partitions, ssl_context),
        )
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "waltz_engine.storage", "--config", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(process, target, log_path)
            yield target
        finally:
            _stop(process)
    finally:
        zookeeper.stop()
