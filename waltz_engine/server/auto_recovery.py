"""Automatic re-replication (issue 24 item 2): a storage node this server has not reached for
``server.autoRecovery.graceMs`` has its replicas moved to live nodes, as a decommission would.

A recorded move no mover carries out (a decommission that failed or was killed) is stale once
this server holds the lease: where it involves a node past the grace it is taken over (its
target answers: the move goes on as this server's) or cancelled (its target is the lost node:
a target already assigned beside its source leaves the assignment again), so it never blocks
the re-replication of a node lost later, and a partition still never has two movers. Why
auto-recovery does not act (another mover holds the lease, no replica to copy from, no node
to copy to, a move failing) is logged once, and again only when the reason changes.

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

from waltz_engine.common.errors import WaltzError, without_java_class
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.server.config import AutoRecoverySettings
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StoreLayout
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.storage.replica_mover import (
    MoveError,
    ReplicaMover,
    holders,
    plan_moves,
    release_only,
    settled_moves,
    under_way,
)
from waltz_engine.zk import replica_moves
from waltz_engine.zk.replica_moves import REASON_AUTO_RECOVERY, ReplicaMove
from waltz_engine.zk.store_metadata import change_replicas

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
        # The reason logged for each thing auto-recovery cannot do now: logged again only when
        # it changes (every check would repeat it).
        self._said: dict[str, str] = {}
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
                self._settled("check")
            except (WaltzError, OSError, TimeoutError, KazooException) as e:
                self._once(
                    "check",  # kazoo's ConnectionLoss says nothing in words: its name does.
                    f"{without_java_class(str(e) or type(e).__name__)}; "
                    f"trying again every {self.check_interval_ms} ms",
                )

    def _once(self, key: str, reason: str) -> None:
        """Log why auto-recovery does not act on ``key``, unless that was the last thing said."""
        if self._said.get(key) != reason:
            self._said[key] = reason
            log.warning("auto-recovery: %s", reason)

    def _settled(self, key: str) -> None:
        self._said.pop(key, None)

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
        # A move no mover will finish: its target is lost (it may hold no replica in the assignment).
        stale = [m for m in moves if m.target in self._lost() and not release_only(layout, m)]
        if not self._past_grace and not work and not stale:
            return
        if not await asyncio.to_thread(replica_moves.try_lease, self._zk, self._root, self._holder):
            # Another server or a decommission moves replicas now; look again next time.
            if self._past_grace:
                holder = await asyncio.to_thread(replica_moves.lease_holder, self._zk, self._root)
                self._once(
                    "lease",
                    f"storage nodes {', '.join(sorted(self._past_grace))} are past the grace, but "
                    f"{holder} moves replicas now: waiting for it",
                )
            return
        self._settled("lease")
        self._lease_held = True
        try:
            await self._act(mover, live)
        finally:
            self._lease_held = False
            await asyncio.to_thread(replica_moves.release_lease, self._zk, self._root)

    def _lost(self) -> set[str]:
        """The storage nodes unreachable for the grace or longer, whether they hold replicas or not."""
        now = asyncio.get_running_loop().time()
        grace_s = self._settings.grace_ms / 1000
        return {s for s, since in self._unreachable_since.items() if now - since >= grace_s}

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
        if await self._resolve_stale(layout, live):
            layout = await mover.layout()
        for storage in sorted(self._past_grace):
            await self._plan(mover, layout, storage, live)
        moves = await asyncio.to_thread(replica_moves.read_moves, self._zk, self._root)
        layout = await mover.layout()
        for move in moves:
            if not _ours(mover, layout, move) or not _can_go_on(mover, layout, live, move):
                continue
            key = f"move {move.partition_id}"
            try:
                if await mover.run(move):
                    self._done.inc()
                self._settled(key)
            except (WaltzError, OSError, TimeoutError) as e:
                self._failed.inc()
                self._once(key, f"partition {move.partition_id}: {without_java_class(str(e))}; trying again")
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
            self._once(f"plan {storage}", f"storage node {storage} is past the grace, but {e}")
            return
        if orphaned:
            self._once(
                f"orphaned {storage}",
                f"partitions {sorted(orphaned)} of {storage} have no replica that answers: they wait",
            )
        else:
            self._settled(f"orphaned {storage}")
        self._settled(f"plan {storage}")
        if planned:
            targets = ", ".join(f"{m.partition_id} to {m.target}" for m in planned)
            log.info(
                "auto-recovery: storage node %s is past the grace: moving partitions %s", storage, targets
            )
            for move in planned:
                log.info("auto-recovery: %s", await mover.describe(layout, move))
            settled = settled_moves(layout, recorded)
            await asyncio.to_thread(replica_moves.add_moves, self._zk, self._root, planned, settled)

    async def _resolve_stale(self, layout: StoreLayout, live: set[str]) -> bool:
        """Under the lease, no other mover runs: a recorded move that still changes the replicas
        and involves a node past the grace is stale. Its target lost: cancel it (a target
        assigned beside its source leaves the assignment); its source lost, its target
        answering: take it over. True when the assignment changed."""
        lost = self._lost()
        changed = False
        for move in await asyncio.to_thread(replica_moves.read_moves, self._zk, self._root):
            if release_only(layout, move):
                continue
            p, held_by = move.partition_id, holders(layout, move.partition_id)
            if move.target in lost:
                if move.target in held_by and move.source in held_by:
                    await asyncio.to_thread(change_replicas, self._zk, self._root, (), [(move.target, p)])
                    changed = True
                await asyncio.to_thread(replica_moves.finish_move, self._zk, self._root, move)
                log.warning(
                    "auto-recovery: partition %d: cancelled the %s move from %s to %s: its target is lost",
                    p,
                    move.reason,
                    move.source,
                    move.target,
                )
            elif move.source in lost and move.target in live and move.reason != REASON_AUTO_RECOVERY:
                taken = move._replace(reason=REASON_AUTO_RECOVERY)
                await asyncio.to_thread(replica_moves.replace_move, self._zk, self._root, move, taken)
                log.warning(
                    "auto-recovery: partition %d: taking over the %s move from %s to %s, which no mover "
                    "carries out, its source being lost",
                    p,
                    move.reason,
                    move.source,
                    move.target,
                )
        return changed


def _can_go_on(mover: ReplicaMover, layout: StoreLayout, live: set[str], move: ReplicaMove) -> bool:
    """A move whose only step left is telling its source node waits until that node answers."""
    return move.source in live or not release_only(layout, move)


def _ours(mover: ReplicaMover, layout: StoreLayout, move: ReplicaMove) -> bool:
    """What a server carries out: its own moves, and telling a node back that it no longer holds
    a partition whatever moved it (a decommission of a node that was down)."""
    return move.reason == REASON_AUTO_RECOVERY or release_only(layout, move)
