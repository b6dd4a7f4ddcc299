"""The store of one server (``StoreImpl``): storage connections, partitions, assignment watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from kazoo.client import KazooClient

from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.server.store.config import CONNECTIVITY_CHECK_TIMEOUT_MS, StoreConfig
from waltz_engine.server.store.errors import StoreError
from waltz_engine.server.store.replica_connection import StorageConnections
from waltz_engine.server.store.store_partition import StorePartition
from waltz_engine.server.store.store_session_manager import StoreSessionManager
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import ReplicaAssignments, ReplicaId
from waltz_engine.zk.store_metadata import (
    read_connection_metadata,
    read_replica_assignments,
    read_store_params,
)

log = logging.getLogger(__name__)

METRICS_GROUP = "waltz-server.store"


class Store:
    def __init__(
        self,
        zk_client: KazooClient,
        cluster_root: str,
        ssl_context: ssl.SSLContext | None,
        config: StoreConfig,
        metrics: MetricsRegistry | None = None,
        network: Network = ASYNCIO_NETWORK,
    ) -> None:
        self._zk = zk_client
        self._network = network
        self._root = cluster_root
        self._ssl_context = ssl_context
        self._config = config.check()
        self._metrics = metrics
        self._num_partitions: int | None = None
        self._connections: StorageConnections | None = None
        self._assignment: dict[str, tuple[int, ...]] = {}
        self._assignment_order: list[str] = []
        self.admin_ports: dict[str, int] = {}
        self._partitions: dict[int, StorePartition] = {}
        self._managers: dict[int, StoreSessionManager] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._background: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        assert self._loop is None, "a store starts once"
        self._loop = asyncio.get_running_loop()
        params = await asyncio.to_thread(read_store_params, self._zk, self._root)
        assignments = await asyncio.to_thread(read_replica_assignments, self._zk, self._root)
        connections = await asyncio.to_thread(read_connection_metadata, self._zk, self._root)
        self._num_partitions = params.num_partitions
        self.admin_ports = connections.as_dict()
        self._connections = StorageConnections(
            self._ssl_context,
            params.key,
            params.num_partitions,
            self._config.request_timeout_ms,
            self._network,
        )
        self._set_assignment(assignments)
        self._running = True
        if self._metrics is not None:
            self._metrics.gauge(METRICS_GROUP, "num-partitions", lambda: len(self._partitions))
        self._zk.DataWatch(ClusterPaths.of(self._root).assignment, self._on_assignment_watch)

    @property
    def num_partitions(self) -> int:
        assert self._num_partitions is not None, "Store.start() first"
        return self._num_partitions

    def _set_assignment(self, assignments: ReplicaAssignments) -> None:
        self._assignment = assignments.as_dict()
        self._assignment_order = [storage for storage, _ in assignments.replicas]

    def replica_ids(self, partition_id: int) -> list[ReplicaId]:
        return [
            ReplicaId(partition_id, storage)
            for storage in self._assignment_order
            if partition_id in self._assignment[storage]
        ]

    def replica_info(self) -> dict[int, list[str]]:
        return {p: [r.storage for r in self.replica_ids(p)] for p in range(self.num_partitions)}

    def partition(self, partition_id: int) -> StorePartition:
        assert self._running and self._connections is not None, "Store.start() first"
        if not 0 <= partition_id < self.num_partitions:
            raise StoreError(f"partition {partition_id} is not in 0..{self.num_partitions - 1}")
        partition = self._partitions.get(partition_id)
        if partition is None:
            manager = StoreSessionManager(
                partition_id, self._config, self._zk, self._root, self._connections, self.replica_ids
            )
            partition = StorePartition(manager, self._config)
            self._managers[partition_id] = manager
            self._partitions[partition_id] = partition
            if self._metrics is not None:
                group = f"{METRICS_GROUP}.partition-{partition_id}"
                self._metrics.gauge(group, "high-water-mark", lambda: partition.high_water_mark)
                self._metrics.gauge(group, "healthy", lambda: partition.healthy)
        return partition

    async def remove_partition(self, partition_id: int) -> None:
        partition = self._partitions.pop(partition_id, None)
        self._managers.pop(partition_id, None)
        if partition is not None:
            await partition.close()
            if self._metrics is not None:
                self._metrics.remove_group(f"{METRICS_GROUP}.partition-{partition_id}")

    async def check_connectivity(self) -> dict[str, bool]:
        """Per storage node of the assignment: does an OPEN succeed on a fresh connection?"""
        assert self._connections is not None

        async def probe(storage: str) -> bool:
            assert self._connections is not None
            client = self._connections.new_client(storage)
            try:
                await client.open(CONNECTIVITY_CHECK_TIMEOUT_MS)
                return True
            except Exception:
                return False
            finally:
                await client.close()

        storages = list(self._assignment_order)
        results = await asyncio.gather(*(probe(storage) for storage in storages))
        return dict(zip(storages, results, strict=True))

    # --- assignment watch -----------------------------------------------------------------------

    def _on_assignment_watch(self, data: bytes | None, _stat: Any) -> bool:
        """kazoo's thread: hand the new bytes to the loop; False stops the watch."""
        if not self._running or self._loop is None:
            return False
        if data is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._on_assignment_data, data)
        return True

    def _on_assignment_data(self, data: bytes) -> None:
        if not self._running:
            return
        try:
            assignments = ReplicaAssignments.from_bytes(data)
        except Exception as e:
            log.error("cannot decode the replica assignment: %s", e)
            return
        if assignments.as_dict() == self._assignment:
            return
        before = {p: set(self.replica_ids(p)) for p in self._managers}
        self._set_assignment(assignments)
        changed = [p for p in self._managers if set(self.replica_ids(p)) != before[p]]
        # The original reopens every partition's session (its PR #93); only a partition whose
        # replica set changed needs to, and the others keep appending undisturbed.
        log.info("replica assignment changed: new store sessions for partitions %s", changed)
        for partition_id in changed:
            manager = self._managers[partition_id]
            if manager.close_current_session():
                # Reopen now, as the original: recovery brings new replicas in, and resolves
                # the appends the closed session left undecided.
                task = asyncio.create_task(self._partitions[partition_id].ensure_open())
                self._background.add(task)
                task.add_done_callback(self._reopened)

    def _reopened(self, task: asyncio.Task[None]) -> None:
        # A reopen ends early when the partition closes or a newer generation owns it; both
        # are the normal course of a reassignment, said once, not a "never retrieved" traceback.
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.info("reopening a partition after the assignment change ended: %s", error)

    async def close(self) -> None:
        self._running = False
        for task in list(self._background):
            task.cancel()
        for partition_id in list(self._partitions):
            await self.remove_partition(partition_id)
        if self._connections is not None:
            await self._connections.close()
        if self._metrics is not None:
            self._metrics.remove_group(METRICS_GROUP)
