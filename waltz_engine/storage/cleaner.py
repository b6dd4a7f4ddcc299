"""The retention cleaner of a storage node: a background task that re-reads the effective
retention bounds from ZooKeeper (on start, then every interval) and removes, in each assigned
partition, the whole head segments that lie below the bound (``waltz_engine.zk.retention``).

Only committed data goes: a partition removes nothing at or above its local low-water mark + 1,
and never its current segment. When ZooKeeper cannot be read the round is skipped rather than
acting on stale bounds (a bound may have been lowered, an export may have started).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kazoo.exceptions import KazooException

from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperSettings, connect, new_client
from waltz_engine.zk.retention import NodeBounds, read_node_bounds

if TYPE_CHECKING:  # the node package imports this module
    from waltz_engine.storage.node.partition_worker import PartitionWorker

log = logging.getLogger(__name__)

# How often the cleaner re-reads the bounds; `storage.retention.check.interval.ms` overrides.
DEFAULT_RETENTION_CHECK_INTERVAL_MS = 60_000

Removed = dict[int, list[tuple[int, int]]]  # partition id → (first, max) txids of removed segments


class RetentionCleaner:
    def __init__(
        self,
        zookeeper: ZooKeeperSettings,
        num_partitions: int,
        workers: Callable[[], Mapping[int, PartitionWorker]],
        interval_ms: int = DEFAULT_RETENTION_CHECK_INTERVAL_MS,
        zk_connector: ZooKeeperConnector = new_client,
    ) -> None:
        assert interval_ms > 0
        self._zookeeper = zookeeper
        self._zk_connector = zk_connector
        self._num_partitions = num_partitions
        self._workers = workers
        self._interval_ms = interval_ms
        self._bounds: dict[int, int] = {}
        self._late_start_bounds: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self, *, first_round: bool = True) -> None:
        """One round now (so an empty replica knows the bounds before it serves), then periodic.
        Without ``first_round`` (a node started without ZooKeeper) the first is a period away."""
        if first_round:
            await self.run_once()
        self._task = asyncio.create_task(self._run(), name="retention-cleaner")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def apply_bounds(self) -> None:
        """Tell every worker its partition's last known effective bound (also after assignment)."""
        for partition_id, worker in self._workers().items():
            worker.retention_bound = self._bounds.get(partition_id)
            worker.late_start_bound = self._late_start_bounds.get(partition_id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_ms / 1000)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention cleaner round failed; retrying next round")

    async def refresh_bounds(self) -> bool:
        """Read the bounds now and tell the workers (a partition taken offline for a copy that
        may start at the retained start); False, the last known kept, when ZooKeeper does not
        answer."""
        try:
            bounds = await asyncio.to_thread(self._read_bounds)
        except (KazooException, WaltzError, OSError, TimeoutError) as e:
            log.warning("retention cleaner: cannot read bounds from ZooKeeper: %s", e)
            return False
        self._bounds, self._late_start_bounds = bounds.effective, bounds.late_start
        self.apply_bounds()
        return True

    async def run_once(self) -> Removed:
        if not await self.refresh_bounds():
            log.warning("retention cleaner: skipping this round")
            return {}
        removed: Removed = {}
        for partition_id, worker in sorted(self._workers().items()):
            bound = self._bounds.get(partition_id)
            partition = worker.partition
            if bound is None or partition is None:
                continue
            try:
                spans = await asyncio.to_thread(partition.remove_head_segments, bound)
            except (StorageError, OSError) as e:
                # Closed by an unassignment meanwhile, or a disk problem: next round tries again.
                log.warning("retention: partition %d: cannot remove segments: %s", partition_id, e)
                continue
            if spans:
                first = spans[-1][1] + 1
                worker.removed_segments(len(spans), first)
                removed[partition_id] = spans
                log.info(
                    "retention: partition %d: removed %d segment(s) with transactions %d..%d "
                    "(effective bound %d); the log now starts at %d",
                    partition_id,
                    len(spans),
                    spans[0][0],
                    spans[-1][1],
                    bound,
                    first,
                )
        return removed

    def _read_bounds(self) -> NodeBounds:
        settings = self._zookeeper
        with connect(settings, self._zk_connector) as client:
            return read_node_bounds(client, settings.cluster_root, self._num_partitions)
