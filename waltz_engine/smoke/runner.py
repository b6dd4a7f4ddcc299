"""`waltz smoke`: the original's smoke test (reference §5.2) with real processes.

ZooKeeper, 3 storage nodes, 3 servers (each behind a a ``TcpProxy``), 2 client processes,
3 partitions; a seeded fault schedule (kill -9 + restart, SIGSTOP/SIGCONT, a ZooKeeper restart,
client↔server and server↔storage cuts) runs while the clients write; then the seven checks.
Every wait is bounded; the cluster, the proxies and the clients are stopped on every exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from waltz_engine.client import Transaction, WaltzClient, WaltzClientConfig
from waltz_engine.common.address import HostPort
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tcp_proxy import HOST as PROXY_HOST
from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.client_tools import HighWaterMarks
from waltz_engine.ops.devcluster import STORAGE
from waltz_engine.smoke import checks, workload
from waltz_engine.smoke.checks import Applied
from waltz_engine.smoke.clients import ClientProcess
from waltz_engine.smoke.cluster import ProxiedCluster, backend_port
from waltz_engine.smoke.hostile import (
    IDLE_FLOOD_HOLD_S,
    Flip,
    FlippedRecordServed,
    flip_sealed_bit,
    forge_frames,
    idle_flood,
    refused_on_read,
)
from waltz_engine.smoke.report import SmokeReport, percentile
from waltz_engine.smoke.schedule import (
    ZOOKEEPER,
    Fault,
    FaultKind,
    ScheduleParams,
    count_by_kind,
    make_schedule,
)
from waltz_engine.storage.admin_ops import StorageContext, admin_client, recover_partition, replica_checksums
from waltz_engine.zk.connection import connect
from waltz_engine.zk.store_metadata import read_store_params

DEFAULT_DURATION_S = 120.0
NUM_PARTITIONS = 3
NUM_CLIENTS = 2
PROGRESS_INTERVAL_S = 5.0
POLL_INTERVAL_S = 0.2
CLIENTS_READY_TIMEOUT_S = 120.0
# After the faults: clients flush and catch up on a healed cluster; generous for a loaded box.
DRAIN_TIMEOUT_S = 180.0
CLUSTER_UP_TIMEOUT_MS = 180_000
REREAD_MIN_TIMEOUT_S = 120.0
REREAD_TXNS_PER_S = 100  # the slowest re-read rate we wait for before giving up
DATA_DIR_NAME = "data"
CLIENTS_DIR_NAME = "clients"
UP, DOWN = "*", "."
NODE_HOST = "127.0.0.1"  # where the dev cluster's nodes listen
REFILL_TIMEOUT_MS = 30_000
# A flip's refill is retried this long: its node may be paused or restarting under another fault.
REFILL_DEADLINE_S = 120.0
REFILL_RETRY_S = 1.0
REREAD_FILE_NAME = "reread.log"  # the re-read's records, as a client's applied.log

T = TypeVar("T")
Console = Callable[[str], None]


@dataclass(frozen=True)
class SmokeOptions:
    directory: Path
    seed: int
    duration_s: float = DEFAULT_DURATION_S
    transactions: int = 0  # 0: as many as fit in the duration
    partitions: int = NUM_PARTITIONS
    num_clients: int = NUM_CLIENTS

    def client_limit(self, index: int) -> int:
        if self.transactions <= 0:
            return 0
        share, rest = divmod(self.transactions, self.num_clients)
        return share + (1 if index < rest else 0)


class SmokeRun:
    def __init__(self, options: SmokeOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.schedule = make_schedule(options.seed, ScheduleParams(options.duration_s))
        self.report = SmokeReport(options.seed, str(options.directory), self.schedule)
        self.cluster = ProxiedCluster(options.directory, options.partitions)
        self.storage_proxies: dict[str, TcpProxy] = {}
        self.server_proxies: dict[str, TcpProxy] = {}
        self.clients: list[ClientProcess] = []
        self.injected: list[Fault] = []
        self.committed: dict[str, list[str]] = {}
        self.unknown: set[str] = set()  # outcomes left unknown: in the log or not, either is right
        self.node_state = {node.name: UP for node in self.cluster.nodes} | {ZOOKEEPER: UP}
        # Node operations block (they wait for a process to exit or to serve) and must not run
        # concurrently (each rewrites the cluster's state file): one worker thread.
        self._nodes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smoke-nodes")
        self._started = time.monotonic()
        self._key: uuid.UUID | None = None
        self._tls = client_context(TlsConfig())
        self._flips: dict[Fault, Flip | None] = {}

    # --- helpers ---------------------------------------------------------------------------------

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def say(self, text: str) -> None:
        self.console(f"[{self.elapsed_s():7.1f}s] {text}")

    async def on_nodes(self, operation: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._nodes, operation)

    def states(self) -> str:
        """The original's ``[sss ttt z]``: storages, servers, ZooKeeper; ``*`` up, ``.`` down."""
        storages = "".join(self.node_state[n.name] for n in self.cluster.storages)
        servers = "".join(self.node_state[n.name] for n in self.cluster.servers)
        return f"[{storages} {servers} {self.node_state[ZOOKEEPER]}]"

    # --- phases ----------------------------------------------------------------------------------

    async def run(self) -> SmokeReport:
        self.console(f"smoke test: seed {self.options.seed}, directory {self.options.directory}")
        self.console(f"fault schedule ({len(self.schedule)} faults):")
        for fault in self.schedule:
            self.console(f"  {fault.at_s:7.1f}s {fault.describe()}")
        try:
            await self.start_cluster()
            await self.write_under_faults()
            await self.drain()
            self.check_clients()
            await self.reread()
            await self.compare_replicas()
        except (WaltzError, OSError, TimeoutError) as e:
            self._error(f"{type(e).__name__}: {e}")
        finally:
            await self.shut_down()
        return self.report

    def _error(self, *errors: str) -> None:
        self.report.error = "; ".join(filter(None, [self.report.error, *errors]))

    async def start_cluster(self) -> None:
        self.say("starting ZooKeeper, 3 storage nodes, 3 servers and their proxies")
        for node in self.cluster.storages:
            proxy = TcpProxy(PROXY_HOST, backend_port(node), listen_port=node.port)
            self.storage_proxies[node.name] = await proxy.start()
        await self.on_nodes(lambda: self.cluster.up(CLUSTER_UP_TIMEOUT_MS))
        # Read while ZooKeeper is surely up: the faults that need the key may run while it is down.
        await self._cluster_key()
        overrides = {}
        for node in self.cluster.servers:
            proxy = await TcpProxy(PROXY_HOST, node.port).start()
            self.server_proxies[node.name] = proxy
            overrides[node.connect_string] = proxy.connect_string
        for index in range(self.options.num_clients):
            self.clients.append(
                await ClientProcess.start(
                    f"client-{index}",
                    self.options.directory / CLIENTS_DIR_NAME / f"client-{index}",
                    self.cluster.client_config_path,
                    self.options.seed + index,
                    self.options.client_limit(index),
                    overrides,
                )
            )
        await self._until(
            lambda: all(c.state != workload.STARTING for c in self.clients),
            CLIENTS_READY_TIMEOUT_S,
            "the clients did not start",
        )
        self._started = time.monotonic()  # the schedule's clock starts with the workload
        self.say(f"{self.states()} clients running")

    async def write_under_faults(self) -> None:
        tasks = {fault: asyncio.create_task(self._fault(fault)) for fault in self.schedule}
        progress = asyncio.create_task(self._progress())
        await self._until(self._writing_done, None, "")
        for fault, task in tasks.items():
            if fault not in self.injected:
                task.cancel()  # not begun yet: it would outlast the workload
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        failures = fault_failures(list(tasks), results)
        for failure in failures:
            self.say(failure)
        self._error(*failures)
        self.report.write_elapsed_s = self.elapsed_s()
        progress.cancel()
        self.report.faults_injected = count_by_kind(self.injected)
        self.say(f"{self.states()} faults over: {len(self.injected)} injected; stopping the writers")
        for client in self.clients:
            await client.send(workload.STOP)

    def _writing_done(self) -> bool:
        if self.elapsed_s() >= self.options.duration_s:
            return True
        if any(c.exited for c in self.clients):
            raise WaltzError(
                f"a client process exited early; see {self.options.directory / CLIENTS_DIR_NAME}"
            )
        return self.options.transactions > 0 and all(c.state != workload.RUNNING for c in self.clients)

    async def _fault(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.at_s - self.elapsed_s()))
        self.injected.append(fault)
        await self._inject(fault)
        self.say(f"{self.states()} fault {len(self.injected)}: {fault.describe()}")
        if fault.kind.takes_down:
            await asyncio.sleep(max(0.0, fault.until_s - self.elapsed_s()))
            await self._recover(fault)
            self.say(f"{self.states()} {fault.target} back")

    async def _inject(self, fault: Fault) -> None:
        if fault.kind is FaultKind.CLIENT_DISCONNECT:
            self.server_proxies[fault.target].disconnect_all()
        elif fault.kind is FaultKind.STORAGE_DISCONNECT:
            self.storage_proxies[fault.target].disconnect_all()
        elif fault.kind is FaultKind.ZOOKEEPER_RESTART:
            await self.on_nodes(self.cluster.stop_zookeeper)
        elif fault.kind is FaultKind.KILL:
            await self.on_nodes(self.cluster.node(fault.target).kill)
        elif fault.kind is FaultKind.PAUSE:
            await self.on_nodes(self.cluster.node(fault.target).pause)
        elif fault.kind is FaultKind.FORGED_FRAMES:
            node = self.cluster.node(fault.target)
            # Seeded by the fault, so that a replay sends the same garbage.
            rng = random.Random(f"{self.options.seed}:{fault.at_s}")
            key = await self._cluster_key()
            port = backend_port(node)
            refused = await forge_frames(NODE_HOST, port, self._tls, key, self.options.partitions, rng)
            self.say(f"{fault.target} refused {refused} forged requests")
        elif fault.kind is FaultKind.IDLE_FLOOD:
            node = self.cluster.node(fault.target)
            port = backend_port(node) if node.kind == STORAGE else node.port
            opened = await idle_flood(NODE_HOST, port)
            self.say(f"{fault.target}: {opened} idle connections held {IDLE_FLOOD_HOLD_S:.0f}s, closed")
        elif fault.kind is FaultKind.SEALED_SEGMENT_FLIP:
            node = self.cluster.node(fault.target)
            directories = [node.directory / DATA_DIR_NAME / str(p) for p in range(self.options.partitions)]
            rng = random.Random(f"{self.options.seed}:{fault.at_s}")
            flip = await asyncio.to_thread(flip_sealed_bit, directories, rng)
            self._flips[fault] = flip
            if flip is None:
                self.say(f"{fault.target}: no sealed segment yet, nothing flipped")
            else:
                where = f"transaction {flip.transaction_id} in {flip.segment.name}"
                self.say(f"{fault.target}: flipped a bit of {where}")
        if fault.kind.takes_down:
            self.node_state[fault.target] = DOWN

    async def _recover(self, fault: Fault) -> None:
        if fault.kind is FaultKind.ZOOKEEPER_RESTART:
            await self.on_nodes(self.cluster.start_zookeeper)
        elif fault.kind is FaultKind.KILL:
            await self.on_nodes(self.cluster.node(fault.target).launch)  # its startup is not waited for
        elif fault.kind is FaultKind.PAUSE:
            await self.on_nodes(self.cluster.node(fault.target).resume)
        elif fault.kind is FaultKind.SEALED_SEGMENT_FLIP:
            flip = self._flips.pop(fault, None)
            if flip is not None:
                await self._refill(fault.target, flip)
        self.node_state[fault.target] = UP

    async def _refill(self, target: str, flip: Flip) -> None:
        """:meth:`_refill_once`, again while the node does not answer (paused, restarting)."""
        deadline = time.monotonic() + REFILL_DEADLINE_S
        while True:
            try:
                await self._refill_once(target, flip)
                return
            except FlippedRecordServed:
                raise
            except (WaltzError, OSError, TimeoutError) as e:
                if time.monotonic() + REFILL_RETRY_S > deadline:
                    raise WaltzError(
                        f"{target}: partition {flip.partition_id} not refilled within "
                        f"{REFILL_DEADLINE_S:.0f}s: {e}"
                    ) from None
                self.say(f"{target}: refill of partition {flip.partition_id} failed, retrying: {e}")
                await asyncio.sleep(REFILL_RETRY_S)

    async def _refill_once(self, target: str, flip: Flip) -> None:
        """The flipped record must be refused; then the operator's refill from a healthy replica
        (the partition offline on that node meanwhile), after which the node holds no damage."""
        node = self.cluster.node(target)
        key = await self._cluster_key()
        context = StorageContext(key, self.options.partitions, self._tls, REFILL_TIMEOUT_MS)
        address = HostPort(NODE_HOST, node.admin_port)
        async with admin_client(context, address) as admin:
            if not await refused_on_read(admin, flip):
                raise FlippedRecordServed(
                    f"{target} served transaction {flip.transaction_id} of partition {flip.partition_id} "
                    "with a flipped bit"
                )
            await admin.set_partition_available([flip.partition_id], False)
            try:
                source = next(n for n in self.cluster.storages if n.name != target)
                result = await recover_partition(
                    context,
                    HostPort(NODE_HOST, source.admin_port),
                    address,
                    backend_port(node),
                    flip.partition_id,
                    refill_only=True,
                )
            finally:
                await admin.set_partition_available([flip.partition_id], True)
        # Only the rotten segment is refilled: cutting the copy to its low-water mark, as the
        # original's recovery does, could remove a committed copy that a quorum still needs.
        done = f"{result.records_refilled} records refilled, nothing cut"
        self.say(f"{target}: partition {flip.partition_id} repaired from {source.name} ({done})")

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            self.say(f"{self.states()} {self._counts()}")

    def _counts(self) -> str:
        total = {
            k: sum(c.count(k) for c in self.clients) for k in ("committed", "applied", "retries", "failed")
        }
        tps = total["committed"] / max(self.elapsed_s(), POLL_INTERVAL_S)
        return " ".join(f"{k}={v}" for k, v in total.items()) + f" tps={tps:.1f}"

    async def drain(self) -> None:
        """Heal the cluster, let the writers flush, and wait until every client applied up to
        every partition's high-water mark."""
        await self.on_nodes(lambda: self.cluster.up(CLUSTER_UP_TIMEOUT_MS))
        self.say("cluster healed (cluster verify passed); waiting for the clients to flush")
        await self._until(
            lambda: all(c.state == workload.FLUSHED for c in self.clients),
            DRAIN_TIMEOUT_S,
            "the clients did not flush their transactions",
        )
        marks = await high_water_marks(self._client_config(), self.options.partitions)
        self.say(f"high-water marks {marks}; waiting for the clients to apply them")
        await self._until(
            lambda: all(c.mark(p) >= m for c in self.clients for p, m in marks.items()),
            DRAIN_TIMEOUT_S,
            "the clients did not apply every transaction",
        )
        for client in self.clients:
            await client.finish()
        self.say(f"clients done: {self._counts()}")

    def _client_config(self) -> WaltzClientConfig:
        return WaltzClientConfig.from_config(Config.load(self.cluster.client_config_path))

    def check_clients(self) -> None:
        committed_records = {c.name: c.committed() for c in self.clients}
        self.committed = {name: [d for d, _ in records] for name, records in committed_records.items()}
        applied = {c.name: c.applied() for c in self.clients}
        not_committed = {c.name: c.told(workload.NOT_COMMITTED_FILE) for c in self.clients}
        self.unknown = {d for c in self.clients for d in c.told(workload.UNKNOWN_FILE)}
        latencies = [ms for records in committed_records.values() for _, ms in records]
        self.report.committed = len(latencies)
        self.report.latency_p50_ms = percentile(latencies, 50)
        self.report.latency_p99_ms = percentile(latencies, 99)
        self.report.failed = sum(c.count("failed") for c in self.clients)
        self.report.retries = sum(c.count("retries") for c in self.clients)
        self._record(checks.check_no_double_commit(self.committed))
        self._record(checks.check_consecutive(applied))
        self._record(checks.check_no_double_apply(applied))
        self._record(checks.check_checksum(self.committed, applied, self.unknown))
        self._record(checks.check_not_committed_absent(not_committed, applied))

    def _record(self, result: checks.CheckResult) -> None:
        self.report.checks.append(result)
        self.say(f"check {len(self.report.checks)} {result.line()}")

    async def reread(self) -> None:
        self.say("restarting every node for the re-read")
        await self.on_nodes(self.cluster.down)
        await self.on_nodes(lambda: self.cluster.up(CLUSTER_UP_TIMEOUT_MS))
        started = time.monotonic()
        timeout_s = max(REREAD_MIN_TIMEOUT_S, self.report.committed / REREAD_TXNS_PER_S)
        async with asyncio.timeout(timeout_s):
            records, marks = await reread_all(self._client_config(), self.options.partitions)
        self.report.verify_elapsed_s = time.monotonic() - started
        self.report.high_water_marks = marks
        lines = "".join(f"{r.partition_id} {r.transaction_id} {r.data}\n" for r in records)
        await asyncio.to_thread((self.options.directory / REREAD_FILE_NAME).write_text, lines)
        applied = self.clients[0].applied() if self.clients else []
        self._record(checks.check_reread(self.committed, records, marks, self.unknown, applied))

    async def _cluster_key(self) -> uuid.UUID:
        if self._key is None:
            settings = self.cluster.zookeeper_settings()

            def read() -> uuid.UUID:
                with connect(settings) as zk:
                    return read_store_params(zk, settings.cluster_root).key

            self._key = await asyncio.to_thread(read)
        return self._key

    async def compare_replicas(self) -> None:
        key = await self._cluster_key()
        await self.on_nodes(self.cluster.down)
        sums = {
            node.name: replica_checksums(
                node.directory / DATA_DIR_NAME, key, self.options.partitions
            ).checksums
            for node in self.cluster.storages
        }
        self._record(checks.check_replicas(sums))

    async def shut_down(self) -> None:
        for client in self.clients:
            if not client.exited:
                await client.finish()
        with contextlib.suppress(WaltzError, OSError):
            await self.on_nodes(self.cluster.down)
        for proxy in [*self.storage_proxies.values(), *self.server_proxies.values()]:
            await proxy.close()
        self._nodes.shutdown()

    async def _until(self, condition: Callable[[], bool], timeout_s: float | None, what: str) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not condition():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout_s:.0f}s")
            await asyncio.sleep(POLL_INTERVAL_S)


def fault_failures(faults: Sequence[Fault], results: Sequence[object]) -> list[str]:
    """What each fault task that raised says, naming its fault (a cancelled one did not begin)."""
    return [
        f"fault {fault.describe()} at {fault.at_s:.1f}s failed: {type(result).__name__}: {result}"
        for fault, result in zip(faults, results, strict=True)
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError)
    ]


async def high_water_marks(config: WaltzClientConfig, partitions: int) -> dict[int, int]:
    client = await WaltzClient.create(HighWaterMarks(), replace(config, auto_mount=False))
    try:
        return {p: await client.high_water_mark(p) for p in range(partitions)}
    finally:
        await client.close()


class _Reader(HighWaterMarks):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[Applied] = []

    async def on_transaction(self, transaction: Transaction) -> None:
        data = await transaction.data()
        self.records.append(Applied(transaction.partition_id, transaction.transaction_id, data.hex()))


async def reread_all(config: WaltzClientConfig, partitions: int) -> tuple[list[Applied], dict[int, int]]:
    """Every partition from transaction 0 to its high-water mark, with a fresh client."""
    reader = _Reader()
    async with WaltzClient(reader, config) as client:
        marks = {p: await client.high_water_mark(p) for p in range(partitions)}
        while any(reader.get_client_high_water_mark(p) < m for p, m in marks.items()):
            await asyncio.sleep(POLL_INTERVAL_S)
    return reader.records, marks


def run_smoke(options: SmokeOptions, console: Console) -> SmokeReport:
    return asyncio.run(SmokeRun(options, console).run())


def parse_duration_s(text: str) -> float:
    """``90``, ``90s``, ``500ms``, ``30m``, ``2h`` → seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    stripped = text.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if stripped.endswith(suffix):
            return float(stripped[: -len(suffix)]) * units[suffix]
    return float(stripped)
