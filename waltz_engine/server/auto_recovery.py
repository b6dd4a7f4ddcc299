"""Automatic re-replication (issue 24 item 2): a storage node this server has not reached for
``server.autoRecovery.graceMs`` has its replicas moved to live nodes, as a decommission would.

Every server watches the storage nodes; only the one holding the replica mover lease (an
ephemeral znode of our own, ``zk.replica_moves``) acts, and only while it has something to do,
so two servers never move the same partition at once and a decommission can take the lease in
between. A node back within the grace keeps its replicas; a node back after it is told it no
longer holds them (``PARTITION_ASSIGNMENT`` assign=false, its files kept). Each decision is one
log line; the gauges under ``waltz-server.auto-recovery`` count each state.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.server.config import AutoRecoverySettings
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StoreLayout
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.storage.replica_mover import (
    MoveError,
    ReplicaMover,
    plan_moves,
    release_only,
    settled_moves,
    under_way,
)
from waltz_engine.zk import replica_moves
from waltz_engine.zk.replica_moves import REASON_AUTO_RECOVERY, ReplicaMove

log = logging.getLogger(__name__)

METRICS_GROUP = "waltz-server.auto-recovery"
# The nodes are looked at every grace / CHECKS_PER_GRACE, within these bounds.
CHECKS_PER_GRACE = 10
MIN_CHECK_INTERVAL_MS = 1_000
MAX_CHECK_INTERVAL_MS = 30_000
# Every request to a storage node while watching or moving answers within this.
REQUEST_TIMEOUT_MS = 5_000


class AutoRecovery:
    def __init__(
        self,
        zk: KazooClient,
        root: str,
        ssl_context: ssl.SSLContext | None,
        settings: AutoRecoverySettings,
        holder: str,
        metrics: MetricsRegistry,
        access: ClusterAccess | None = None,
        network: Network = ASYNCIO_NETWORK,
    ) -> None:
        assert settings.grace_ms > 0
        self._access = access  # the servers' committed high-water marks bound each copy
        self._zk = zk
        self._root = root
        self._ssl_context = ssl_context
        self._network = network  # the storage nodes are reached through it (the simulator's, in `waltz sim`)
        self._settings = settings
        self._holder = holder
        self._metrics = metrics
        self._unreachable_since: dict[str, float] = {}
        self._past_grace: set[str] = set()
        self._moves_recorded = 0
        self._lease_held = False
        self._done = metrics.counter(METRICS_GROUP, "moves-done")
        self._failed = metrics.counter(METRICS_GROUP, "moves-failed")
        self._task: asyncio.Task[None] | None = None

    @property
    def check_interval_ms(self) -> int:
        interval = self._settings.grace_ms // CHECKS_PER_GRACE
        return max(MIN_CHECK_INTERVAL_MS, min(MAX_CHECK_INTERVAL_MS, interval))

    def start(self) -> None:
        m, g = self._metrics, METRICS_GROUP
        m.gauge(g, "unreachable-nodes", lambda: len(self._unreachable_since))
        m.gauge(g, "nodes-past-grace", lambda: len(self._past_grace))
        m.gauge(g, "moves-recorded", lambda: self._moves_recorded)
        m.gauge(g, "lease-held", lambda: int(self._lease_held))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="auto-recovery")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._metrics.remove_group(METRICS_GROUP)

    async def _run(self) -> None:
        log.info(
            "auto-recovery: storage nodes unreachable for %d ms have their replicas moved "
            "(at most %d bytes/s)",
            self._settings.grace_ms,
            self._settings.bytes_per_second,
        )
        while True:
            # First a pause: the storage nodes of a cluster starting with this server get one.
            await asyncio.sleep(self.check_interval_ms / 1000)
            try:
                await self._check()
            except (WaltzError, OSError, TimeoutError, KazooException) as e:
                # kazoo's ConnectionLoss says nothing in words: its name does.
                why = str(e) or type(e).__name__
                log.warning("auto-recovery: %s; trying again in %d ms", why, self.check_interval_ms)

    async def _check(self) -> None:
        layout = await asyncio.to_thread(admin_ops.read_store_layout, self._zk, self._root)
        mover = ReplicaMover(
            self._zk,
            self._root,
            layout.context(self._ssl_context, REQUEST_TIMEOUT_MS, self._network),
            self._settings.bytes_per_second,
            lambda line: log.info("auto-recovery: %s", line),
            access=self._access,
        )
        live = await mover.live_nodes(layout)
        self._track(layout, live)
        moves = await asyncio.to_thread(replica_moves.read_moves, self._zk, self._root)
        self._moves_recorded = len(moves)
        work = [m for m in moves if _ours(mover, layout, m) and _can_go_on(mover, layout, live, m)]
        if not self._past_grace and not work:
            return
        if not await asyncio.to_thread(replica_moves.try_lease, self._zk, self._root, self._holder):
            return  # another server or a decommission moves replicas now; look again next time
        self._lease_held = True
        try:
            await self._act(mover, live)
        finally:
            self._lease_held = False
            await asyncio.to_thread(replica_moves.release_lease, self._zk, self._root)

    def _track(self, layout: StoreLayout, live: set[str]) -> None:
        now = asyncio.get_running_loop().time()
        for storage in sorted(layout.admin_ports):
            since = self._unreachable_since.get(storage)
            if storage in live:
                if since is not None:
                    away_ms = int((now - since) * 1000)
                    kept = "" if storage in self._past_grace else ", within the grace: it keeps its replicas"
                    log.info(
                        "auto-recovery: storage node %s answers again after %d ms%s", storage, away_ms, kept
                    )
                    del self._unreachable_since[storage]
                    self._past_grace.discard(storage)
            elif since is None:
                self._unreachable_since[storage] = now
                log.info(
                    "auto-recovery: storage node %s does not answer; its replicas move if it stays away "
                    "%d ms",
                    storage,
                    self._settings.grace_ms,
                )
            elif (now - since) * 1000 >= self._settings.grace_ms and layout.assignments.get(storage):
                self._past_grace.add(storage)

    async def _act(self, mover: ReplicaMover, live: set[str]) -> None:
        layout = await mover.layout()  # as it is now that no other mover runs
        for storage in sorted(self._past_grace):
            await self._plan(mover, layout, storage, live)
        moves = await asyncio.to_thread(replica_moves.read_moves, self._zk, self._root)
        layout = await mover.layout()
        for move in moves:
            if not _ours(mover, layout, move) or not _can_go_on(mover, layout, live, move):
                continue
            try:
                if await mover.run(move):
                    self._done.inc()
            except (WaltzError, OSError, TimeoutError) as e:
                self._failed.inc()
                log.warning("auto-recovery: partition %d: %s; trying again later", move.partition_id, e)
        layout = await mover.layout()
        self._past_grace = {s for s in self._past_grace if layout.assignments.get(s)}

    async def _plan(self, mover: ReplicaMover, layout: StoreLayout, storage: str, live: set[str]) -> None:
        recorded = await asyncio.to_thread(replica_moves.read_moves, self._zk, self._root)
        # Only what another replica can be copied from; the rest waits for a node to answer.
        orphaned = {
            p
            for p in layout.assignments.get(storage, ())
            if not any(p in ids and s in live for s, ids in layout.assignments.items() if s != storage)
        }
        try:
            planned = plan_moves(
                layout,
                storage,
                live,
                reason=REASON_AUTO_RECOVERY,
                skip=under_way(layout, recorded) | orphaned,
            )
        except MoveError as e:
            log.warning("auto-recovery: storage node %s: %s", storage, e)
            return
        if orphaned:
            log.warning(
                "auto-recovery: partitions %s have no replica that answers: they wait", sorted(orphaned)
            )
        if planned:
            targets = ", ".join(f"{m.partition_id} to {m.target}" for m in planned)
            log.info(
                "auto-recovery: storage node %s is past the grace: moving partitions %s", storage, targets
            )
            settled = settled_moves(layout, recorded)
            await asyncio.to_thread(replica_moves.add_moves, self._zk, self._root, planned, settled)


def _can_go_on(mover: ReplicaMover, layout: StoreLayout, live: set[str], move: ReplicaMove) -> bool:
    """A move whose only step left is telling its source node waits until that node answers."""
    return move.source in live or not release_only(layout, move)


def _ours(mover: ReplicaMover, layout: StoreLayout, move: ReplicaMove) -> bool:
    """What a server carries out: its own moves, and telling a node back that it no longer holds
    a partition whatever moved it (a decommission of a node that was down)."""
    return move.reason == REASON_AUTO_RECOVERY or release_only(layout, move)
