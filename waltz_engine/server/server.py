"""The Waltz server process (reference §2.1, §2.3, §2.9; the original's ``WaltzServer``).

``ServerCore`` holds what a server serves — the store, the shared caches and the partitions
this server owns — and answers the client handler; it needs no ZooKeeper, so tests can run it
over a fake store. ``WaltzServer`` adds the process around it: ZooKeeper, the store, the TLS
client port, the cluster manager (whose assignments open, re-generation and close partitions)
and the HTTP endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from waltz_engine import __version__
from waltz_engine.common import clock
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.loop_turns import count_turns
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.process import run_service
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.net.channel import serve
from waltz_engine.net.connection_limits import ConnectionGate
from waltz_engine.net.http_endpoints import HttpEndpoints
from waltz_engine.net.listener import Listener
from waltz_engine.net.tls import client_context, server_context
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network, tls_context
from waltz_engine.server.config import EngineSettings, ServerConfig
from waltz_engine.server.feed_cache import FeedCache
from waltz_engine.server.handler import ClientHandler
from waltz_engine.server.partition import Partition
from waltz_engine.server.store_partition_like import StorePartitionLike
from waltz_engine.server.transaction_cache import TransactionCache, TransactionFetcher
from waltz_engine.wire.client_messages import CLIENT_CODECS, EXTENDED_CLIENT_CODECS
from waltz_engine.wire.hello import SERVER_HELLO_TEXT
from waltz_engine.zk.cluster import read_cluster_params
from waltz_engine.zk.cluster_manager import ClusterManager, ManagedServer
from waltz_engine.zk.connection import ZooKeeperConnector, connect, new_client
from waltz_engine.zk.payloads import PartitionInfo
from waltz_engine.zk.store_metadata import read_store_params

if TYPE_CHECKING:
    from waltz_engine.auth.authorizer import Authorizer

log = logging.getLogger("waltz_engine.server")

SERVICE_NAME = "waltz-server"
METRIC_GROUP = "waltz-server"
HEALTH_CHECK_NAME = "server-health-check"
# ZooKeeper counts as healthy while disconnected for less than this many session timeouts.
ZK_UNHEALTHY_AFTER_SESSION_TIMEOUTS = 2
STOP_CONNECTIONS_TIMEOUT_S = 10.0

SetPreferred = Callable[[tuple[int, ...]], Awaitable[None]]


class AutoRecoveryLike(Protocol):
    async def close(self) -> None: ...


class StoreLike(Protocol):
    """The part of the store layer's Store the server uses."""

    @property
    def num_partitions(self) -> int: ...

    def partition(self, partition_id: int) -> StorePartitionLike: ...

    async def remove_partition(self, partition_id: int) -> None: ...

    async def check_connectivity(self) -> dict[str, bool]: ...

    def replica_info(self) -> dict[int, list[str]]: ...

    async def close(self) -> None: ...


class ServerStartError(WaltzError):
    """The server cannot start with this cluster (missing or inconsistent metadata)."""


class ServerCore:
    """The partitions this server owns over one store (``handler.ServerServices``)."""

    def __init__(
        self,
        store: StoreLike,
        settings: EngineSettings,
        metrics: MetricsRegistry,
        set_preferred: SetPreferred | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.num_partitions = store.num_partitions
        self.feed_cache = FeedCache(settings.feed_cache_size_bytes, metrics)
        self.fetcher = TransactionFetcher(
            TransactionCache(settings.transaction_data_cache_size_bytes, metrics)
        )
        self.partitions: dict[int, Partition] = {}
        self.preferred_partitions: tuple[int, ...] = ()
        self._set_preferred = set_preferred
        self._assignment_lock = asyncio.Lock()
        self._reopenings: set[asyncio.Task[None]] = set()

    # --- ServerServices --------------------------------------------------------------------

    def partition(self, partition_id: int) -> Partition | None:
        return self.partitions.get(partition_id)

    def partition_ids(self) -> list[int]:
        return sorted(self.partitions)

    def partitions_health(self) -> dict[int, bool]:
        return {pid: p.healthy for pid, p in sorted(self.partitions.items())}

    async def check_storage_connectivity(self) -> dict[str, bool]:
        return await self.store.check_connectivity()

    async def add_preferred_partitions(self, partition_ids: tuple[int, ...]) -> bool:
        return await self._change_preferred(partition_ids, add=True)

    async def remove_preferred_partitions(self, partition_ids: tuple[int, ...]) -> bool:
        return await self._change_preferred(partition_ids, add=False)

    async def _change_preferred(self, partition_ids: tuple[int, ...], add: bool) -> bool:
        if not partition_ids or max(partition_ids) >= self.num_partitions or min(partition_ids) < 0:
            return False
        current = set(self.preferred_partitions)
        updated = current | set(partition_ids) if add else current - set(partition_ids)
        preferred = tuple(sorted(updated))
        if self._set_preferred is not None:
            try:
                await self._set_preferred(preferred)
            except WaltzError as e:
                log.warning("preferred partitions %s not applied: %s", preferred, e)
                return False
        self.preferred_partitions = preferred
        return True

    # --- assignment ----------------------------------------------------------------------

    async def set_partitions(self, assigned: list[PartitionInfo]) -> None:
        """Opens new partitions, raises generations, closes the ones no longer assigned."""
        async with self._assignment_lock:
            wanted = {info.partition_id: info.generation for info in assigned}
            for partition_id in [pid for pid in self.partitions if pid not in wanted]:
                await self._close_partition(partition_id)
            for partition_id, generation in sorted(wanted.items()):
                existing = self.partitions.get(partition_id)
                if existing is not None:
                    await existing.set_generation(generation)
                    continue
                await self._open_partition(partition_id, generation)

    async def _open_partition(self, partition_id: int, generation: int) -> None:
        partition = Partition(
            partition_id,
            generation,
            self.store.partition(partition_id),
            self.feed_cache,
            self.fetcher,
            self.settings,
            self.metrics,
        )
        partition.on_task_failure = self._partition_failed
        await partition.open()
        self.partitions[partition_id] = partition
        log.info("partition %d opened with generation %d", partition_id, generation)

    def _partition_failed(self, partition: Partition) -> None:
        """A partition whose task died would accept appends and never answer them: replace it
        (close, reopen with its generation), as a reassignment would; clients remount."""
        task = asyncio.get_running_loop().create_task(self._reopen(partition))
        self._reopenings.add(task)
        task.add_done_callback(self._reopenings.discard)

    async def _reopen(self, partition: Partition) -> None:
        async with self._assignment_lock:
            partition_id = partition.partition_id
            if self.partitions.get(partition_id) is not partition:
                return  # already closed or replaced by an assignment
            log.warning("partition %d: reopening after a failure", partition_id)
            clients = partition.registered_clients()
            await self._close_partition(partition_id)
            await self._open_partition(partition_id, partition.generation)
            # Their mounts, flushes and feeds ended with the old partition, untold: a reassignment
            # tells them through ZooKeeper, a replacement on this server does not, and they waited
            # for good (the simulator's seed 1207 of issue 32: a mount behind an append whose
            # outcome could not be read). They lose the connection and remount here.
            for client in clients:
                client.disconnect()

    async def _close_partition(self, partition_id: int) -> None:
        partition = self.partitions.pop(partition_id)
        await partition.close()
        await self.store.remove_partition(partition_id)
        self.feed_cache.remove_partition(partition_id)
        self.fetcher.cache.remove_partition(partition_id)
        log.info("partition %d closed", partition_id)

    async def close(self) -> None:
        async with self._assignment_lock:
            for partition_id in list(self.partitions):
                await self._close_partition(partition_id)


class WaltzServer:
    """One server in this process: ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        config: ServerConfig,
        network: Network = ASYNCIO_NETWORK,
        zk_connector: ZooKeeperConnector = new_client,
    ) -> None:
        self.config = config
        self.network = network
        self._zk_connector = zk_connector
        self.metrics = MetricsRegistry()
        self.core: ServerCore | None = None
        self.cluster_manager: ClusterManager | None = None
        self.server_id: int | None = None
        self.cluster_name = ""
        self.closed = False
        self._zk_stack = contextlib.ExitStack()
        self._zk: KazooClient | None = None
        self.authorizer: Authorizer | None = None
        self._zk_disconnected_since_s: float | None = None
        self._store: StoreLike | None = None
        self._listener: Listener | None = None
        self._handler: ClientHandler | None = None
        self._http: HttpEndpoints | None = None
        self._assigned: list[PartitionInfo] | None = None
        self._assignment_wakeup = asyncio.Event()
        self._assigner: asyncio.Task[None] | None = None
        self._auto_recovery: AutoRecoveryLike | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.config.advertised_host}:{self.port}"

    @property
    def port(self) -> int:
        if self._listener is not None and self._listener.sockets:
            return int(self._listener.sockets[0].getsockname()[1])
        return self.config.port

    async def start(self) -> None:
        config = self.config
        settings = config.zookeeper
        self._zk = zk = await asyncio.to_thread(
            self._zk_stack.enter_context, connect(settings, self._zk_connector)
        )
        zk.add_listener(self._on_zk_state)
        cluster = await asyncio.to_thread(read_cluster_params, zk, settings.cluster_root)
        self.cluster_name = cluster.name
        store_params = await asyncio.to_thread(self._read_store_params, zk)
        if store_params.num_partitions != cluster.num_partitions:
            raise ServerStartError("inconsistent number of partition")
        self._store = store = await self._open_store(zk)
        self.cluster_manager = manager = ClusterManager(
            zk, settings.cluster_root, is_local_host=self.network.is_local_host
        )
        self.core = core = ServerCore(store, config.engine, self.metrics, manager.set_preferred_partitions)
        self._register_metrics()
        self.authorizer = authorizer = await self._start_authorizer(zk)
        self._handler = handler = ClientHandler(core, authorizer)
        self._listener = await serve(
            config.host,
            config.port,
            tls_context(self.network, lambda: server_context(config.tls)),
            # Our version 5 (refusals a client can stop on) only where there are refusals: a
            # server without the authorizer offers the original's versions, byte for byte.
            CLIENT_CODECS if authorizer is None else EXTENDED_CLIENT_CODECS,
            SERVER_HELLO_TEXT,
            handler,
            "server client port",
            ConnectionGate(config.connection_limits),
            self.network,
        )
        self._assigner = asyncio.get_running_loop().create_task(self._apply_assignments(), name="assignments")
        await manager.start()
        self.server_id = await manager.manage(
            ManagedServer(config.advertised_host, self.port, self._on_partitions, core.preferred_partitions)
        )
        if config.auto_recovery.grace_ms > 0:
            self._auto_recovery = self._start_auto_recovery(zk)
        if config.jetty_port is not None:
            self._http = HttpEndpoints(SERVICE_NAME, self.metrics)
            self._http.add_health_check(HEALTH_CHECK_NAME, self.health)
            await self._http.start(config.host, config.jetty_port)
        else:
            log.warning("server.jetty.port is not set: no HTTP endpoints (health, metrics)")
        log.info(
            "server %d ready: cluster %s (%s), endpoint %s, %d partitions, http port %s",
            self.server_id,
            settings.cluster_root,
            self.cluster_name,
            self.endpoint,
            cluster.num_partitions,
            config.jetty_port if config.jetty_port is not None else "none",
        )

    async def _start_authorizer(self, zk: KazooClient) -> Authorizer | None:
        """With ``authorizer.enabled``: our own znodes secured (when this server has a ZooKeeper
        identity to write them with), the ACLs read and watched."""
        settings = self.config.authorizer
        if not settings.enabled:
            return None
        from waltz_engine.auth.authorizer import Authorizer
        from waltz_engine.auth.zk_acls import secure_own_znodes

        root = self.config.zookeeper.cluster_root
        await asyncio.to_thread(secure_own_znodes, zk, root, self.config.zookeeper)
        authorizer = Authorizer(
            settings, root, f"server {self.config.advertised_host}:{self.port}", self.metrics
        )
        authorizer.start(zk)
        return authorizer

    def _start_auto_recovery(self, zk: KazooClient) -> AutoRecoveryLike:
        # Imported here, as the store: it brings the operators' replica mover.
        from waltz_engine.server.auto_recovery import AutoRecovery
        from waltz_engine.storage.network_reader import ClusterAccess

        holder = f"server {self.server_id} ({self.endpoint})"
        recovery = AutoRecovery(
            zk,
            self.config.zookeeper.cluster_root,
            tls_context(self.network, lambda: client_context(self.config.tls)),
            self.config.auto_recovery,
            holder,
            self.metrics,
            ClusterAccess(self.config.zookeeper, self.config.tls, self.network, self._zk_connector),
            self.network,
        )
        recovery.start()
        return recovery

    def _read_store_params(self, zk: KazooClient) -> Any:
        root = self.config.zookeeper.cluster_root
        if zk.exists(f"{root.rstrip('/')}/store") is None:
            raise ServerStartError("store parameter not specified")
        return read_store_params(zk, root)

    async def _open_store(self, zk: KazooClient) -> StoreLike:
        # Imported here: the store layer is the heaviest import and only the process needs it.
        from waltz_engine.server.store import Store, StoreConfig

        s = self.config.store
        store = Store(
            zk,
            self.config.zookeeper.cluster_root,
            tls_context(self.network, lambda: client_context(self.config.tls)),
            StoreConfig(
                s.max_batch_size,
                s.initial_retry_interval_ms,
                s.max_retry_interval_ms,
                s.checkpoint_interval,
                low_water_mark_interval_ms=s.low_water_mark_interval_ms,
            ),
            self.metrics,
            self.network,
        )
        await store.start()
        result: StoreLike = store
        return result

    def _on_partitions(self, assigned: list[PartitionInfo]) -> None:
        # Only the latest assignment matters; one task applies them in turn.
        self._assigned = assigned
        self._assignment_wakeup.set()

    async def _apply_assignments(self) -> None:
        while True:
            await self._assignment_wakeup.wait()
            self._assignment_wakeup.clear()
            assigned, self._assigned = self._assigned, None
            if assigned is not None and self.core is not None:
                log.info("assigned partitions %s", [(p.partition_id, p.generation) for p in assigned])
                await self.core.set_partitions(assigned)

    def _on_zk_state(self, state: str) -> None:
        # kazoo thread: a plain assignment is enough for a health check to read.
        self._zk_disconnected_since_s = None if state == KazooState.CONNECTED else clock.monotonic_s()

    def zookeeper_healthy(self) -> bool:
        since = self._zk_disconnected_since_s
        if since is None:
            return self._zk is not None and bool(self._zk.connected)
        limit_s = ZK_UNHEALTHY_AFTER_SESSION_TIMEOUTS * self.config.zookeeper.session_timeout_ms / 1000
        return clock.monotonic_s() - since < limit_s

    def health(self) -> tuple[bool, dict[str, Any]]:
        zookeeper = self.zookeeper_healthy()
        partitions = self.core.partitions_health() if self.core is not None else {}
        healthy = zookeeper and all(partitions.values())
        return healthy, {"zookeeper": zookeeper, "partitions": {str(k): v for k, v in partitions.items()}}

    def _register_metrics(self) -> None:
        m, g = self.metrics, METRIC_GROUP
        m.gauge(g, "is-closed", lambda: self.closed)
        m.gauge(g, "cluster-name", lambda: self.cluster_name)
        m.gauge(g, "server-id", lambda: self.server_id if self.server_id is not None else -1)
        m.gauge(g, "endpoint", lambda: self.endpoint)
        m.gauge(g, "waltz-server-num-partitions", lambda: len(self.core.partitions) if self.core else 0)
        m.gauge(g, "replica-info", self._replica_info)
        m.gauge(g, "waltz-version-id", lambda: __version__)
        if self.network is ASYNCIO_NETWORK:
            turns = count_turns(asyncio.get_running_loop())
            # The loop's iterations (selector returns) so far: `bench producers` reports them per commit.
            m.gauge(g, "loop-iterations", lambda: turns.count if turns is not None else None)

    def _replica_info(self) -> dict[str, list[str]]:
        if self._store is None or self.core is None:
            return {}
        info = self._store.replica_info()
        return {str(pid): info.get(pid, []) for pid in self.core.partition_ids()}

    async def stop(self) -> None:
        """Leave the cluster, stop serving, close partitions and the store, disconnect."""
        if self.closed:
            return
        self.closed = True
        if self.cluster_manager is not None:
            # Leaving is best effort: with ZooKeeper unreachable the session's expiry removes us.
            with contextlib.suppress(WaltzError, KazooException):
                if self.cluster_manager.server_id is not None:
                    await self.cluster_manager.unmanage()
            await self.cluster_manager.close()
        if self._listener is not None:
            self._listener.close()
            await self._listener.end_connections(STOP_CONNECTIONS_TIMEOUT_S)
        await cancel_and_wait(self._assigner)
        if self._auto_recovery is not None:
            await self._auto_recovery.close()
        if self.core is not None:
            await self.core.close()
        if self._store is not None:
            await self._store.close()
        if self._http is not None:
            await self._http.close()
        if self.authorizer is not None:
            self.authorizer.stop()
        if self._zk is not None:
            self._zk.remove_listener(self._on_zk_state)
        await asyncio.to_thread(self._zk_stack.close)
        log.info("server stopped")


def run(config_path: Path | str, log_level: str = "info") -> int:
    """`waltz server start`: serve until SIGTERM/SIGINT; 0 on a clean stop, 1 on a startup error."""
    title = f"waltz server start --config {config_path}"
    return run_service(
        lambda: ServerConfig.load(config_path), WaltzServer, log_level, title, freeze_heap=True
    )
