"""A storage node: read StoreParams from ZooKeeper (or, while ZooKeeper is out, from the
control file of a formatted directory: ``cluster_identity``), open the storage directory, serve
the data port, the admin port and HTTP until SIGTERM/SIGINT (reference §1.1)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import ssl
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from waltz_engine import __version__
from waltz_engine.common import clock
from waltz_engine.common.backoff import Backoff
from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.common.loop_turns import count_turns
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.process import run_service
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.net.channel import ConnectionHandler, FramedConnection, serve
from waltz_engine.net.connection_limits import ConnectionGate
from waltz_engine.net.http_endpoints import HttpEndpoints
from waltz_engine.net.listener import Listener
from waltz_engine.net.tls import server_context
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network, tls_context
from waltz_engine.storage.cleaner import RetentionCleaner
from waltz_engine.storage.file_system import OS_DISK, Disk
from waltz_engine.storage.held_append import SharedSync
from waltz_engine.storage.node.admin_handler import AdminHandler
from waltz_engine.storage.node.cluster_identity import (
    StoreIdentity,
    ZooKeeperCheck,
    disk_params,
    node_names,
    read_params,
)
from waltz_engine.storage.node.config import (
    KEY_ADMIN_PORT,
    KEY_JETTY_PORT,
    KEY_PORT,
    KEY_SYNC_SCOPE,
    KEY_ZOOKEEPER_START_TIMEOUT,
    SYNC_SCOPE_AUTO,
    SYNC_SCOPE_FILE,
    SYNC_SCOPE_FILE_SYSTEM,
    StorageConfig,
)
from waltz_engine.storage.node.connection_threads import ConnectionThreads
from waltz_engine.storage.node.data_handler import DataHandler
from waltz_engine.storage.node.disk_passes import DiskPasses, RunnerFactory, ThreadedRunner
from waltz_engine.storage.node.integrity import INTEGRITY_CHECK_NAME, integrity_health
from waltz_engine.storage.node.partition_worker import PartitionWorker
from waltz_engine.storage.node.scrubber import Scrubber
from waltz_engine.storage.node.session_bounds import SessionBounds
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.storage.tier.offload import TierOffloader, replica_name
from waltz_engine.storage.tier.store import OBJECT_STORE_TIER, TierSeam
from waltz_engine.wire.admin_messages import ADMIN_CODEC
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.hello import STORAGE_ADMIN_SERVER_HELLO_TEXT, STORAGE_SERVER_HELLO_TEXT
from waltz_engine.wire.storage_messages import STORAGE_DATA_PORT_CODEC
from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperError, new_client

if TYPE_CHECKING:
    from waltz_engine.auth.authorizer import Authorizer

log = logging.getLogger("waltz_engine.storage.node")

T = TypeVar("T")

SERVICE_NAME = "waltz-storage"
METRIC_GROUP = "waltz-storage"
HEALTH_CHECK_NAME = "storage-health-check"
DISK_CHECK_NAME = "storage-disk-check"
# How long stopping waits for connection handlers to end once cancelled.
STOP_CONNECTIONS_TIMEOUT_S = 10.0
# A starting node's retries while ZooKeeper does not answer (until the configured limit).
ZOOKEEPER_RETRY_INITIAL_MS = 200
ZOOKEEPER_RETRY_MAX_MS = 5_000
ZOOKEEPER_RETRY_JITTER = 0.25


def _port_error(key: str, host: str, port: int, error: OSError) -> StorageError:
    """One line naming the config key: a port in use (or not bindable) stops the start."""
    reason = error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        reason = "address already in use (is another process listening on it?)"
    return StorageError(f"cannot listen on {host}:{port} ('{key}'): {reason}")


async def read_cluster_params(
    config: StorageConfig, connector: ZooKeeperConnector = new_client, on_disk: StoreIdentity | None = None
) -> StoreIdentity | None:
    """Key and partition count from ``<cluster.root>/store``.

    ZooKeeper may start after the node (a machine booting, an ensemble restarting): the node
    keeps trying with backoff for ``storage.zookeeper.start.timeout.ms``, a warning per try.
    A reachable ZooKeeper without the cluster is an error at once. With ``on_disk`` (the
    directory's control file holds a cluster) a ZooKeeper that does not answer is not waited
    for: None, and the node starts from its disk (``cluster_identity``).
    """
    limit_ms = config.zookeeper_start_timeout_ms
    deadline_s = clock.monotonic_s() + limit_ms / 1000
    backoff = Backoff(ZOOKEEPER_RETRY_INITIAL_MS, ZOOKEEPER_RETRY_MAX_MS, jitter=ZOOKEEPER_RETRY_JITTER)
    while True:
        left_ms = max(1, int((deadline_s - clock.monotonic_s()) * 1000))
        connect_timeout_ms = min(config.zookeeper.connect_timeout_ms, left_ms)
        try:
            settings = config.zookeeper._replace(connect_timeout_ms=connect_timeout_ms)
            return await asyncio.to_thread(read_params, settings, connector)
        except ZooKeeperError as e:
            if on_disk is not None:
                log.warning(
                    "storage node starting without ZooKeeper (%s): serving the replicas on its disk, "
                    "of the cluster its control file names (key %s, %d partitions); ZooKeeper is "
                    "checked in the background until it answers",
                    e,
                    on_disk.key,
                    on_disk.num_partitions,
                )
                return None
            delay_ms = backoff.next_delay_ms()
            if clock.monotonic_s() + delay_ms / 1000 >= deadline_s:
                raise StorageError(
                    f"{e}; gave up after {limit_ms} ms ('{KEY_ZOOKEEPER_START_TIMEOUT}'): "
                    "start ZooKeeper, or check zookeeper.connectString"
                ) from None
            log.warning("%s; retrying in %d ms", e, delay_ms)
            await asyncio.sleep(delay_ms / 1000)


class StorageNode:
    """One storage node in this process: ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        config: StorageConfig,
        network: Network = ASYNCIO_NETWORK,
        zk_connector: ZooKeeperConnector = new_client,
        disk: Disk = OS_DISK,
        disk_runner: RunnerFactory = ThreadedRunner,
        tier_seam: TierSeam = OBJECT_STORE_TIER,
    ) -> None:
        self.config = config
        # Data connections read by threads of their own (``storage.data.connection.threads``);
        # only the asyncio network's sockets can be: the simulator keeps the loop's path.
        self.connection_threads: ConnectionThreads | None = None
        self._tier_seam = tier_seam
        self.network = network
        self._zk_connector = zk_connector
        self._disk = disk
        self.metrics = MetricsRegistry()
        self.manager: StorageManager | None = None
        self.workers: dict[int, PartitionWorker] = {}
        self._disk_runner = disk_runner
        self.passes: DiskPasses | None = None
        self._admin_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="storage-admin")
        self._servers: list[Listener] = []
        # One count of open connections for the data and admin ports together.
        self._gate = ConnectionGate(config.connection_limits)
        self._http: HttpEndpoints | None = None
        self._stopped = False
        # Set once the directory is open and the handlers exist; connections wait for it.
        self._open = asyncio.Event()
        self.cleaner: RetentionCleaner | None = None
        self.session_bounds = SessionBounds(config.zookeeper, zk_connector)
        self.scrubber: Scrubber | None = None
        self.tier: TierOffloader | None = None
        self.authorizer: Authorizer | None = None
        self._authorizer_zk: Any = None
        # Set only by a node started without ZooKeeper (``cluster_identity``).
        self.zookeeper_check: ZooKeeperCheck | None = None
        self._failed = asyncio.Event()
        self.failure: WaltzError | None = None
        # How a disk pass of several partitions makes them durable (``storage.sync.scope``), and why.
        self.sync_scope = ""
        # The whole-disk sync of the passes (storage.sync.scope), when the node uses one.
        self._shared_sync: SharedSync | None = None

    async def _off_loop(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._admin_executor, work)

    def worker_of(self, partition_id: int) -> PartitionWorker | None:
        worker = self.workers.get(partition_id)
        return worker if worker is not None and worker.partition is not None else None

    def assigned_partition_ids(self) -> list[int]:
        return sorted(p for p, w in self.workers.items() if w.partition is not None)

    async def start(self) -> None:
        """Bind every port, then open the storage directory, then serve.

        The ports come first so that a start that fails on a port in use leaves a new (empty)
        directory as it was: no control file, no lock. Connections accepted before the
        directory is open wait for it (a moment) before their requests are served.
        """
        config = self.config
        ssl_context = tls_context(self.network, lambda: server_context(config.tls))
        # (One trip off the loop for both: the simulator's schedules count the trips.)
        on_disk, (whole_disk, why) = await self._off_loop(
            lambda: (disk_params(self._disk, config.directory), sync_scope(config, self._disk))
        )
        in_zookeeper = await read_cluster_params(config, self._zk_connector, on_disk)
        if in_zookeeper is not None:
            key, num_partitions = in_zookeeper
            log.info("cluster %s: key %s, %d partitions", config.zookeeper.cluster_root, key, num_partitions)
        else:
            assert on_disk is not None
            key, num_partitions = on_disk
        self.session_bounds.start()
        self._register_metrics()
        loop = asyncio.get_running_loop()
        self.sync_scope = f"{SYNC_SCOPE_FILE_SYSTEM if whole_disk else SYNC_SCOPE_FILE} ({why})"
        log.info("a disk pass of several partitions syncs %s", _SYNC_WORDS[whole_disk] + why)
        if whole_disk:
            self._shared_sync = SharedSync(self._disk.whole_sync(config.directory))
        self.passes = DiskPasses(loop, self._disk_runner(loop), self.metrics, METRIC_GROUP, self._shared_sync)
        if self.network is ASYNCIO_NETWORK and config.data_connection_threads:
            self.connection_threads = ConnectionThreads(loop, self.passes, config.data_connection_threads)

        handlers: dict[str, ConnectionHandler] = {}

        def when_open(name: str) -> ConnectionHandler:
            async def handle(conn: FramedConnection) -> None:
                await self._open.wait()
                await handlers[name](conn)

            return handle

        self._servers.append(
            await self._listen(
                KEY_PORT,
                config.port,
                ssl_context,
                {STORAGE_DATA_PORT_CODEC.version: STORAGE_DATA_PORT_CODEC},
                STORAGE_SERVER_HELLO_TEXT,
                when_open("data"),
                "storage data port",
            )
        )
        self._servers.append(
            await self._listen(
                KEY_ADMIN_PORT,
                config.admin_port,
                ssl_context,
                {ADMIN_CODEC.version: ADMIN_CODEC},
                STORAGE_ADMIN_SERVER_HELLO_TEXT,
                when_open("admin"),
                "storage admin port",
            )
        )
        if config.jetty_port is not None:
            http = HttpEndpoints(SERVICE_NAME, self.metrics)
            http.add_health_check(
                HEALTH_CHECK_NAME,
                lambda: (self._open.is_set(), {"storage": "true" if self._open.is_set() else "starting"}),
            )
            http.add_health_check(INTEGRITY_CHECK_NAME, lambda: integrity_health(self.workers))
            http.add_health_check(DISK_CHECK_NAME, self._disk_health)
            try:
                await http.start(config.host, config.jetty_port)
            except OSError as e:
                raise _port_error(KEY_JETTY_PORT, config.host, config.jetty_port, e) from None
            self._http = http
        else:
            log.warning("storage.jetty.port is not set: no HTTP endpoints (health, metrics)")

        def open_manager() -> StorageManager:
            self._disk.mkdir(config.directory, parents=True)
            return StorageManager(
                config.directory,
                key,
                num_partitions,
                segment_size_threshold_bytes=config.segment_size_threshold_bytes,
                segment_cache_capacity=config.segment_cache_capacity,
                disk=self._disk,
            )

        self.manager = manager = await self._off_loop(open_manager)
        if config.tier is not None:
            self.tier = TierOffloader(
                config.tier,
                key,
                replica_name(config.host, config.port),
                config.directory,
                lambda: self.workers,
                self._disk,
                self._tier_seam,
            )
            try:
                await self._off_loop(self.tier.open_store)
            except (WaltzError, OSError) as e:
                # Offload and reads of evicted ranges wait; the rest is served.
                log.warning("tier: %s; trying again every %d ms", e, config.tier.check_interval_ms)
        await self.refresh_partitions()
        self.cleaner = cleaner = RetentionCleaner(
            config.zookeeper,
            num_partitions,
            lambda: self.workers,
            config.retention_check_interval_ms,
            self._zk_connector,
        )
        # Without ZooKeeper its first round can only fail: the node does not wait for it.
        await cleaner.start(first_round=in_zookeeper is not None)
        if config.scrub_bytes_per_second:
            self.scrubber = Scrubber(lambda: self.workers, config.scrub_bytes_per_second, tier=self.tier)
            self.scrubber.start()
        if self.tier is not None:
            self.tier.start()
        self.authorizer = authorizer = self._start_authorizer()
        handlers["data"] = DataHandler(manager, self.worker_of, authorizer, self.connection_threads)
        handlers["admin"] = AdminHandler(
            manager,
            self.metrics,
            self._admin_executor,
            self.refresh_partitions,
            cleaner.refresh_bounds,
            authorizer=authorizer,
        )
        self._open.set()
        if in_zookeeper is None:
            assert on_disk is not None
            self.zookeeper_check = ZooKeeperCheck(
                config.zookeeper,
                self._zk_connector,
                on_disk,
                node_names(config.host, config.port),
                self.assigned_partition_ids,
                self._unassign,
                self._refuse,
            )
            self.zookeeper_check.start()
        log.info(
            "storage node ready: host %s, data port %d, admin port %d, http port %s, directory %s, "
            "assigned partitions %s",
            config.host,
            config.port,
            config.admin_port,
            config.jetty_port if config.jetty_port is not None else "none",
            config.directory,
            self.assigned_partition_ids(),
        )

    async def _unassign(self, partition_ids: list[int]) -> None:
        """What ZooKeeper no longer assigns this node, once it answers: files kept."""
        manager = self.manager
        assert manager is not None
        await self._off_loop(lambda: manager.set_partition_assignment(partition_ids, False, False))
        await self.refresh_partitions()

    async def _refuse(self, error: StorageError) -> None:
        """A disk of another cluster, found once ZooKeeper answers: serve nothing more, and end
        the process (``failed``) as a start with ZooKeeper would have."""
        log.error("%s; the node stops", error)
        self._open.clear()
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.end_connections(STOP_CONNECTIONS_TIMEOUT_S)
        self.failure = error
        self._failed.set()

    async def failed(self) -> WaltzError:
        """Returns the error that made the node stop serving by itself (never, on most days)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    async def _listen(
        self,
        key: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        codecs: Mapping[int, MessageCodec[Any]],
        hello_text: str,
        handler: ConnectionHandler,
        name: str,
    ) -> Listener:
        try:
            return await serve(
                self.config.host,
                port,
                ssl_context,
                codecs,
                hello_text,
                handler,
                name,
                self._gate,
                self.network,
            )
        except OSError as e:
            raise _port_error(key, self.config.host, port, e) from None

    def _disk_health(self) -> tuple[bool, dict[str, Any]]:
        """Unhealthy while a partition's last write failed on the disk (full, or failing)."""
        errors = {str(p): w.write_error for p, w in sorted(self.workers.items()) if w.write_error}
        return (False, {"write_errors": errors}) if errors else (True, {"writes": "ok"})

    def _register_metrics(self) -> None:
        self.metrics.gauge(
            METRIC_GROUP, "waltz-storage-num-partitions", lambda: len(self.assigned_partition_ids())
        )
        if self.network is ASYNCIO_NETWORK:
            # The loop's iterations (selector returns): a lone append request takes one, its
            # pass's start included (loop_turns.run_turn_end); the answer leaves from the disk thread.
            turns = count_turns(asyncio.get_running_loop())
            self.metrics.gauge(
                METRIC_GROUP, "loop-iterations", lambda: turns.count if turns is not None else None
            )
        self.metrics.gauge(METRIC_GROUP, "waltz-storage-partition-ids", self.assigned_partition_ids)
        # Data connections read by a thread of their own now (connection_threads.py).
        self.metrics.gauge(
            METRIC_GROUP,
            "data-connection-threads",
            lambda: self.connection_threads.count() if self.connection_threads is not None else 0,
        )
        self.metrics.gauge(METRIC_GROUP, "waltz-version-id", lambda: __version__)
        # Our extension (issue 33): how a disk pass of several partitions syncs them, and why.
        self.metrics.gauge(METRIC_GROUP, "sync-scope", lambda: self.sync_scope)
        # Our extension: this node can begin a partition's log above 0 (``PartitionWorker._start_late``),
        # so a replica move may copy from the retained start to it (admin_ops.starts_late).
        self.metrics.gauge(METRIC_GROUP, "waltz-storage-starts-late", lambda: True)

    async def refresh_partitions(self) -> None:
        """Attach every open partition to its worker, detach the unassigned ones."""
        manager, passes = self.manager, self.passes
        assert manager is not None and passes is not None

        def snapshot() -> dict[int, tuple[Partition, int]]:
            opened: dict[int, tuple[Partition, int]] = {}
            for partition_id in manager.assigned_partition_ids():
                partition = manager.partition(partition_id)
                if self.tier is not None:
                    self._attach_tier(self.tier, partition)
                opened[partition_id] = (partition, partition.max_transaction_id())
            return opened

        opened = await self._off_loop(snapshot)
        for partition_id, worker in self.workers.items():
            if partition_id not in opened and worker.partition is not None:
                worker.detach()
        for partition_id, (partition, max_transaction_id) in opened.items():
            if partition_id not in self.workers:
                self.workers[partition_id] = PartitionWorker(
                    partition_id, self.metrics, self.session_bounds, passes
                )
            worker = self.workers[partition_id]
            if worker.partition is not partition:
                worker.attach(partition, max_transaction_id)
        if self.cleaner is not None:
            self.cleaner.apply_bounds()

    @staticmethod
    def _attach_tier(tier: TierOffloader, partition: Partition) -> None:
        try:
            tier.attach(partition)
        except (WaltzError, OSError) as e:
            log.warning(
                "tier: partition %d: %s; its evicted range is read once the tier answers",
                partition.partition_id,
                e,
            )

    def _start_authorizer(self) -> Authorizer | None:
        """With ``authorizer.enabled``: the ACLs watched on a ZooKeeper session of their own (denied
        until first read, but for the node principals)."""
        config = self.config
        if not config.authorizer.enabled:
            return None
        from waltz_engine.auth.authorizer import Authorizer

        authorizer = Authorizer(
            config.authorizer,
            config.zookeeper.cluster_root,
            f"storage {config.host}:{config.port}",
            self.metrics,
        )
        self._authorizer_zk = client = self._zk_connector(config.zookeeper)
        client.start_async()
        authorizer.start(client)
        return authorizer

    async def stop(self) -> None:
        """Stop accepting, end connections, finish the batch in hand, close files, release the lock."""
        if self._stopped:
            return
        self._stopped = True
        if self.zookeeper_check is not None:
            await cancel_and_wait(self.zookeeper_check.task)
        if self.authorizer is not None:
            self.authorizer.stop()
        if self._authorizer_zk is not None:
            client, self._authorizer_zk = self._authorizer_zk, None
            await asyncio.get_running_loop().run_in_executor(None, _close_zk, client)
        if self.cleaner is not None:
            await self.cleaner.stop()
        if self.scrubber is not None:
            await self.scrubber.stop()
        if self.tier is not None:
            await self.tier.stop()
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.end_connections(STOP_CONNECTIONS_TIMEOUT_S)
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_CONNECTIONS_TIMEOUT_S):
                    await server.wait_closed()
        if self.connection_threads is not None:
            await self.connection_threads.stop()
        for worker in self.workers.values():
            await worker.stop()
        if self.passes is not None:
            await self.passes.stop()
        if self._shared_sync is not None:
            self._shared_sync.close()
        if self._http is not None:
            await self._http.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._admin_executor.shutdown, True)
        if self.manager is not None:
            await loop.run_in_executor(None, self.manager.close)
        await loop.run_in_executor(None, self.session_bounds.close)
        log.info("storage node stopped: %s closed and unlocked", self.config.directory)


def _close_zk(client: Any) -> None:
    client.stop()
    client.close()


def run(config_path: Path | str, log_level: str = "info") -> int:
    """`waltz storage start`: serve until SIGTERM/SIGINT; 0 on a clean stop, 1 on a startup error."""
    title = f"waltz storage start --config {config_path}"
    return run_service(lambda: StorageConfig.load(config_path), StorageNode, log_level, title)


_SYNC_WORDS = {True: "the whole file system once (syncfs): ", False: "each file on its own (fdatasync): "}


def sync_scope(config: StorageConfig, disk: Disk) -> tuple[bool, str]:
    """Whether a disk pass of several partitions makes them durable with one sync of the whole
    disk (``storage.sync.scope``), and why, in words for the log and the metrics."""
    if config.sync_scope == SYNC_SCOPE_FILE:
        return False, f"{KEY_SYNC_SCOPE} is {SYNC_SCOPE_FILE}"
    if config.sync_scope == SYNC_SCOPE_FILE_SYSTEM:
        return True, f"{KEY_SYNC_SCOPE} is {SYNC_SCOPE_FILE_SYSTEM}"
    safe, why = disk.sync_all_safe(config.directory)
    return safe, f"{KEY_SYNC_SCOPE} is {SYNC_SCOPE_AUTO}: {why}"
