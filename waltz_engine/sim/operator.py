"""The operator's hand in the simulated world (issue 32): actions drawn into the seed's schedule
among the faults, each running the product's own code through the simulator's seams, and the
promise of each checked.

- ``retention``: the operator marks a partition's log removable below a bound (``zk.retention``,
  at most the client's applied high-water mark + 1: what the application consumed); each storage
  node's cleaner removes whole head segments on its own schedule. Promise: a replica removes
  nothing above its local low-water mark (nothing it does not know committed) and nothing at or
  above a bound; the log above the bound reads the same (the replica check).
- ``decommission``: a storage node that holds the partition moves its replica to another live node
  (``ops.decommission``'s coroutine, the ``ReplicaMover``, under the mover lease). Promise: the
  target holds every transaction committed when the move started (no tail dropped) once the move
  is done, and the partition keeps its replica count.
- ``add_storage``: a new storage node is registered in ZooKeeper and started with no partitions;
  later moves (and autorecovery) give it replicas. A decommission adds it first when no live node
  could take a replica.
- ``storage_lost``: a storage node dies and stays away past the servers' auto-recovery grace
  (``server.autoRecovery.graceMs``): a server's ``AutoRecovery`` moves its replicas to live nodes;
  back, it is told it no longer holds them. Promise: every partition has its replica count again.
- ``tier_fault``: the object store the nodes offload to refuses puts, is slow, or answers gets with
  errors, for a while. Tier offload and eviction run on every node throughout (small segments,
  little local room). Promise: only sealed segments at or below the local low-water mark go to
  the tier, and a tier copy holds the bytes of the segment it names.
- ``restart_forced``: a server is restarted and the partition forced onto it, then released.

Retention and the tier act only below a replica's local low-water mark; the servers tell each
replica its committed prefix within a session at most every ``LOW_WATER_MARK_INTERVAL_MS``
(``storage.lowWaterMark.intervalMs``, 20 s by default: longer than a 100-transaction world's
workload), so they have something to act on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient

from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig
from waltz_engine.ops.decommission import _decommission
from waltz_engine.sim.world_constants import OPERATOR_HOST
from waltz_engine.storage import admin_ops
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.storage.node.node import StorageNode
from waltz_engine.storage.node.partition_worker import PartitionWorker
from waltz_engine.storage.replica_mover import ReplicaMover
from waltz_engine.storage.tier.manifest import TierManifest, object_names, replica_prefix
from waltz_engine.storage.tier.offload import replica_name
from waltz_engine.zk import replica_moves
from waltz_engine.zk.connection import connect
from waltz_engine.zk.replica_moves import ReplicaMove
from waltz_engine.zk.retention import set_retention_bound
from waltz_engine.zk.store_metadata import add_storage_node, read_partition_metadata

if TYPE_CHECKING:
    from waltz_engine.sim.world import SimWorld

OPERATOR_KINDS = ("retention", "decommission", "add_storage", "storage_lost", "tier_fault", "restart_forced")
# One decommission at a time (the other actions go on beside it, and beside the servers'
# auto-recovery: the mover lease keeps two movers apart).
MOVING_KINDS = ("decommission",)
# Small segments and a prompt cleaner and tier, so a 100-transaction world has sealed segments
# below the low-water mark to remove, offload and evict.
SEGMENT_SIZE_BYTES = 1_024
RETENTION_CHECK_INTERVAL_MS = 2_000
TIER_CHECK_INTERVAL_MS = 2_000
TIER_LOCAL_BYTES = 3_072  # a few segments stay local; older ones are evicted once uploaded
TIER_BYTES_PER_SECOND = 64 * 1024
LOW_WATER_MARK_INTERVAL_MS = 1_000
AUTO_RECOVERY_GRACE_MS = 20_000
# How far below the client's applied high-water mark + 1 a retention bound falls, at most.
RETENTION_SLACK = 15
RETENTION_ROUNDS = 6
# A lost node stays away this much longer than the grace (the servers look every second).
# (Its links stall rather than refuse, so each look at it lasts the servers' request timeout.)
LOST_BEYOND_GRACE_S = (10.0, 25.0)
MAX_STORE_FAULT_S = 20.0
MIN_STORE_FAULT_S = 0.5
MAX_FORCED_S = 20.0
REPLICATION = 3
# Moves left recorded at the end are run again (an operator re-running a decommission) this often.
FINISH_ATTEMPTS = 3
TIMEOUT_MS = 10_000  # every operator request to a storage node
# An action that fails (ZooKeeper out, the lease taken) is tried again this much later, this often.
ATTEMPTS = 3
RETRY_AFTER_S = 5.0


def operator_storage_keys(enabled: bool) -> dict[str, Any]:
    """A storage node's keys in a world with the operator's actions (``enabled``) or without."""
    from waltz_engine.sim.object_store import SIM_TIER_URL

    if not enabled:
        return {}
    return {
        "storage.segment.size.threshold": SEGMENT_SIZE_BYTES,
        "storage.retention.check.interval.ms": RETENTION_CHECK_INTERVAL_MS,
        "storage.tier.url": SIM_TIER_URL,
        "storage.tier.check.interval.ms": TIER_CHECK_INTERVAL_MS,
        "storage.tier.local.bytes": TIER_LOCAL_BYTES,
        "storage.tier.bytes.per.second": TIER_BYTES_PER_SECOND,
    }


def operator_server_keys(enabled: bool) -> dict[str, Any]:
    """A server's keys with the operator's actions, or without (no auto-recovery either: the
    world exactly as it was before them, where the seeds found then replay)."""
    if not enabled:
        return {"server.autoRecovery.graceMs": 0}
    return {
        "storage.lowWaterMark.intervalMs": LOW_WATER_MARK_INTERVAL_MS,
        "server.autoRecovery.graceMs": AUTO_RECOVERY_GRACE_MS,
    }


class Operator:
    """Carries out the operator's actions on a world, and checks what each promised."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.violations: list[str] = []
        self.bounds: dict[int, int] = {}  # partition -> the highest retention bound set
        self.busy = False  # a decommission is under way
        self.added = 0  # storage nodes added beyond the shape's
        self.moves_done = 0
        self.lost: set[int] = set()  # storage nodes lost (away past the grace) now
        # (storage host, partition) -> the worker and its count of segments removed when last looked at
        self._removals: dict[tuple[str, int], tuple[PartitionWorker | None, int]] = {}

    # --- seams ---------------------------------------------------------------------------------

    def _context(self) -> admin_ops.StorageContext:
        world = self.world
        network = world.network.node(OPERATOR_HOST)
        return admin_ops.StorageContext(world.key, world.shape.partitions, None, TIMEOUT_MS, network)

    def _access(self) -> ClusterAccess:
        world = self.world
        network = world.network.node(OPERATOR_HOST)
        return ClusterAccess(world.settings, TlsConfig(), network, world.zookeeper.connector())

    def _mover(self, zk: KazooClient) -> ReplicaMover:
        root = self.world.settings.cluster_root
        return ReplicaMover(zk, root, self._context(), 0, lambda line: None, access=self._access())

    async def _zk(self, change: Any) -> Any:
        world = self.world

        def run() -> Any:
            with connect(world.settings, world.zookeeper.connector()) as zk:
                return change(zk)

        return await asyncio.to_thread(run)

    # --- actions --------------------------------------------------------------------------------

    def inject(self, kind: str, rng: random.Random, busy: set[str]) -> asyncio.Task[None] | None:
        exclusive = kind in MOVING_KINDS
        world = self.world
        if exclusive and (self.busy or world.liveness.gone_still_assigned()):
            # One change at a time (docs/operations.md): no decommission while a node lost for
            # good still holds replicas, which auto-recovery has yet to move. Its move could not
            # end: a quorum of the replicas of record that stay is not there to vouch for the
            # source (seed 30 after the session's merges: a decommission of a crashed node beside
            # one gone retried past the run's limit for its faults to end).
            return None
        if kind == "storage_lost":
            number = rng.randrange(world.num_storage_nodes)
            if f"storage-{number}" in busy or self.lost or self._rot_elsewhere(f"storage-{number}"):
                # One node lost at a time: three replicas promise to outlive one failure; with
                # two away past the grace no quorum is left to re-replicate from. A node whose
                # media rotted is the one failure already: losing another past the grace leaves
                # one whole copy of a record (seeds 623, 1970, 3370: recovery rightly waits).
                return None
        elif kind == "restart_forced":
            number = rng.randrange(world.num_servers)
            if f"server-{number}" in busy or "partition-0" in busy:
                return None
        else:
            number = 0
        names = {"storage_lost": f"storage-{number}", "restart_forced": f"server-{number}"}
        held = [names[kind]] if kind in names else []
        self.busy = self.busy or exclusive
        busy.update(held)
        world.loop.record("operator", f"{kind} {held[0] if held else ''}".strip())

        async def run() -> None:
            try:
                for attempt in range(1, ATTEMPTS + 1):
                    try:
                        await self._run(kind, number, rng)
                        return
                    except Exception as e:  # the operator reads the error and tries again later
                        world.loop.record("operator", f"{kind} failed: {type(e).__name__}: {e}")
                        if attempt < ATTEMPTS:
                            await asyncio.sleep(RETRY_AFTER_S)
            finally:
                if exclusive:
                    self.busy = False
                busy.difference_update(held)

        return world.loop.create_task(run())

    async def _run(self, kind: str, number: int, rng: random.Random) -> None:
        if kind == "retention":
            await self.retention(rng)
        elif kind == "decommission":
            await self.decommission(rng)
        elif kind == "add_storage":
            await self.add_storage()
        elif kind == "storage_lost":
            await self.storage_lost(number, rng)
        elif kind == "tier_fault":
            await self.tier_fault(rng)
        else:
            await self.restart_forced(number, rng)

    async def retention(self, rng: random.Random) -> None:
        """A policy that keeps what the application consumed lately: a few rounds apart, the
        bound follows the client's applied high-water mark."""
        world = self.world
        partition_id = rng.randrange(world.shape.partitions)
        root = world.settings.cluster_root
        for _ in range(rng.randint(1, RETENTION_ROUNDS)):
            applied = len(world.application.applied.get(partition_id, []))
            bound = max(0, applied - rng.randint(0, RETENTION_SLACK))
            await self._zk(lambda zk, bound=bound: set_retention_bound(zk, root, partition_id, bound))
            self.bounds[partition_id] = max(bound, self.bounds.get(partition_id, 0))
            world.loop.record("operator", f"retention bound {bound} on partition {partition_id}")
            await asyncio.sleep(rng.uniform(1, 2) * RETENTION_CHECK_INTERVAL_MS / 1000)
            self.check_retained()

    async def add_storage(self) -> str | None:
        """A new node registered and started (no partitions yet); its name."""
        world = self.world
        number = world.shape.storage_nodes + self.added
        if self.added >= 1:
            return None  # one spare is enough for a 3-replica world
        self.added += 1
        host = f"storage-{number}"
        storage = f"{host}:{world.storage_port}"
        await self._zk(
            lambda zk: add_storage_node(zk, world.settings.cluster_root, storage, 0, world.storage_admin_port)
        )
        await world.add_storage_node(number)
        world.loop.record("operator", f"added {storage}")
        return storage

    async def _spare(self) -> bool:
        """Whether a live node holds no replica of partition 0 (adding one if none)."""
        layout = await self._zk(lambda zk: admin_ops.read_store_layout(zk, self.world.settings.cluster_root))
        holders = {s for s, ids in layout.assignments.items() if 0 in ids}
        gone = {f"storage-{number}:{self.world.storage_port}" for number in self.world.gone}
        if set(layout.admin_ports) - holders - gone:
            return True
        return await self.add_storage() is not None

    async def decommission(self, rng: random.Random) -> None:
        world = self.world
        if not await self._spare():
            return
        root = world.settings.cluster_root
        layout = await self._zk(lambda zk: admin_ops.read_store_layout(zk, root))
        holders = sorted(s for s, ids in layout.assignments.items() if ids)
        source = rng.choice(holders)
        if source.split(":")[0] in world.dead and self._rot_elsewhere(source.split(":")[0]):
            # A node down is replaced in place (its copy comes from the others): with another's
            # media rotted, that is two of three replicas failed at once (seeds 3752, 24079).
            world.loop.record("operator", f"decommission of {source} skipped: down, and another node rotted")
            return
        goals = {p: len(world.application.applied.get(p, [])) - 1 for p in layout.assignments[source]}
        # Held to its goal only when every node answered throughout (a node down may have been
        # the only other holder of the goal).
        whole, crashes = not world.storage_down, world.storage_crashes
        holder = f"sim operator decommission {source}"
        with connect(world.settings, world.zookeeper.connector()) as zk:
            if not replica_moves.try_lease(zk, root, holder):
                world.loop.record("operator", "decommission: the mover lease is taken")
                return
            try:
                result = await _decommission(self._mover(zk), zk, source, False)
            finally:
                with contextlib.suppress(WaltzError):
                    replica_moves.release_lease(zk, root)
        world.loop.record("operator", f"decommissioned {source}: {len(result.moves)} moves")
        for move in result.moves:
            if move.source != source or move.partition_id not in goals:
                continue
            self.moves_done += 1
            if move.partition_id not in result.remaining:
                await self._check_recorded_without(move)
            if not whole or world.storage_crashes != crashes:
                continue
            held = await self._max_txid(move.target, move.partition_id)
            goal = goals[move.partition_id]
            if held is not None and held < goal:
                self.violations.append(
                    f"a move of partition {move.partition_id} from {source} to {move.target} dropped the "
                    f"tail: the target holds up to {held}, but {goal} was committed when the move started"
                )
        if world.storage_gone is not None:
            await world.storage_gone.after_move()  # the operator's next failure, if planned

    async def _check_recorded_without(self, move: ReplicaMove) -> None:
        """A move that ended left ZooKeeper's replicas of record without its source (a session's
        recovery recorded the replicas that stay): else the next recovery votes over replicas
        that include the source, counts it absent, and needs every one that stays, so one more
        replica lost (the operator's next failure, right after the command returned) stalls the
        log until it returns, for good if its disk is gone (the operator's day, 2026-11-28)."""
        root = self.world.settings.cluster_root
        found = await self._zk(lambda zk: read_partition_metadata(zk, root, move.partition_id))
        if any(state.replica_id.storage == move.source for state in found.metadata.replica_states):
            self.violations.append(
                f"a move of partition {move.partition_id} from {move.source} to {move.target} ended while "
                "ZooKeeper's replicas of record held its source: one more replica lost would stall the log"
            )

    def _rot_elsewhere(self, host: str) -> bool:
        """Whether the world damaged another storage node's media than ``host``'s."""
        world = self.world
        return bool(world.damage) and world.damaged_host is not None and world.damaged_host != host

    async def _max_txid(self, storage: str, partition_id: int) -> int | None:
        for node in self.world.storage:
            if f"{node.config.host}:{node.config.port}" == storage and node.manager is not None:
                with contextlib.suppress(WaltzError, KeyError):
                    return node.manager.partition(partition_id).max_transaction_id()
        return None

    async def storage_lost(self, number: int, rng: random.Random) -> None:
        world = self.world
        if not await self._spare():
            return
        self.lost.add(number)
        try:
            await world.crash_storage(number)
            await asyncio.sleep(AUTO_RECOVERY_GRACE_MS / 1000 + rng.uniform(*LOST_BEYOND_GRACE_S))
            await world.restart_storage(number)
        finally:
            self.lost.discard(number)

    async def tier_fault(self, rng: random.Random) -> None:
        bucket = self.world.bucket
        choice = rng.randrange(3)
        if choice == 0:
            bucket.failing_puts = True
        elif choice == 1:
            bucket.slow_put_factor = rng.uniform(5.0, 50.0)
        else:
            bucket.failing_gets = True
        self.world.loop.record("operator", f"object store fault {('put', 'slow', 'get')[choice]}")
        await asyncio.sleep(rng.uniform(MIN_STORE_FAULT_S, MAX_STORE_FAULT_S))
        bucket.heal()

    async def restart_forced(self, number: int, rng: random.Random) -> None:
        world = self.world
        await world.crash_server(number)
        await world.restart_server(number)
        partition_id = rng.randrange(world.shape.partitions)
        await world.force_assign(partition_id, number)
        await asyncio.sleep(rng.uniform(0.5, MAX_FORCED_S))
        await world.force_unassign(partition_id)

    # --- the end of a seed -----------------------------------------------------------------------

    async def finish(self) -> None:
        """Moves left recorded (a mover stopped by a fault) are run again to their end, as an
        operator re-runs a decommission; then every node is given time to settle."""
        world = self.world
        root = world.settings.cluster_root
        for _ in range(FINISH_ATTEMPTS):
            moves = await self._zk(lambda zk: replica_moves.read_moves(zk, root))
            if not moves:
                return
            with connect(world.settings, world.zookeeper.connector()) as zk:
                if not replica_moves.try_lease(zk, root, "sim operator: finishing moves"):
                    await asyncio.sleep(AUTO_RECOVERY_GRACE_MS / 1000)
                    continue
                try:
                    mover = self._mover(zk)
                    for move in moves:
                        with contextlib.suppress(WaltzError, OSError, TimeoutError):
                            await mover.run(move)
                finally:
                    with contextlib.suppress(WaltzError):
                        replica_moves.release_lease(zk, root)
            # An operator runs a failed move again some time later, not at once: a move waiting
            # for a store session's recovery (its catch-up judged only once a quorum answers, its
            # source leaving only once a recovery records its target) needs that recovery to end.
            await asyncio.sleep(RETRY_AFTER_S)

    def _assigned(self, partition_id: int) -> list[tuple[int, StorageNode]]:
        world = self.world

        def read() -> dict[str, tuple[int, ...]]:
            with connect(world.settings, world.zookeeper.connector()) as zk:
                return admin_ops.read_store_layout(zk, world.settings.cluster_root).assignments

        assignments = read()
        held = {s for s, ids in assignments.items() if partition_id in ids}
        return [(i, n) for i, n in enumerate(world.storage) if f"{n.config.host}:{n.config.port}" in held]

    def assigned_nodes(self, partition_id: int) -> list[StorageNode]:
        """The storage nodes ZooKeeper assigns ``partition_id`` to (what its quorum counts), but
        those lost for good (nothing of them can be read)."""
        return [node for number, node in self._assigned(partition_id) if number not in self.world.gone]

    def assigned_gone(self, partition_id: int) -> int:
        """How many nodes lost for good ZooKeeper still assigns ``partition_id`` to."""
        return sum(1 for number, _ in self._assigned(partition_id) if number in self.world.gone)

    def check_replica_count(self) -> list[str]:
        violations = []
        for partition_id in range(self.world.shape.partitions):
            count = len(self.assigned_nodes(partition_id))  # (live ones: none lost for good)
            if count != REPLICATION:
                violations.append(
                    f"partition {partition_id} has {count} replicas assigned after the operator's moves, "
                    f"not {REPLICATION}"
                )
        return violations

    def check_retained(self) -> None:
        """Retention's promise on every replica whose cleaner removed segments since the last look:
        its log now starts no further than one past its local low-water mark (nothing removed it
        did not know committed), and no further than a bound the operator set."""
        for number, node in enumerate(self.world.storage):
            manager = node.manager
            if manager is None or node._stopped or number in self.world.gone:
                continue
            for partition_id, worker in sorted(node.workers.items()):
                metrics, partition = worker._metrics, worker.partition
                if metrics is None or partition is None:
                    continue
                removed = metrics.removed_segments.count
                with contextlib.suppress(WaltzError):
                    key = (node.config.host, partition_id)
                    seen_worker, seen_removed = self._removals.get(key, (None, 0))
                    self._removals[key] = (worker, removed)
                    if seen_worker is not worker or removed <= seen_removed:
                        continue  # the cleaner removed no segment since the last look
                    # What the cleaner removed, as it reported it: the log's start may lie above
                    # that without retention (a log emptied and begun again at the others'
                    # retained start; taken for retention's, seed 336 of the combined world).
                    through = worker.retention_removed_through
                    low_water_mark = partition.info.current.local_low_water_mark
                    if through > low_water_mark:
                        self.violations.append(
                            f"{node.config.host}: retention removed partition {partition_id}'s "
                            f"transactions up to {through}, above its local low-water mark "
                            f"{low_water_mark} (not known committed)"
                        )
                    bound, first = self.bounds.get(partition_id), partition.first_transaction_id()
                    if bound is None or first > bound:  # (the tier's evicted segments still count)
                        self.violations.append(
                            f"{node.config.host}: retention removed partition {partition_id}'s "
                            f"transactions up to {first - 1}, at or above the highest retention "
                            f"bound set ({bound})"
                        )

    def check_tier(self) -> list[str]:
        """The tier's promise: each segment a manifest names was sealed when uploaded (it is not
        the partition's current segment, and the local segment with its first txid ends where the
        manifest says) and its objects hold the bytes the manifest names (a tier read returns them)."""
        world = self.world
        violations: list[str] = []
        for number, node in enumerate(world.storage):
            manager = node.manager
            if manager is None or node._stopped or number in world.gone:
                continue
            replica = replica_name(node.config.host, node.config.port)
            store = world.bucket.store()
            for partition_id in range(world.shape.partitions):
                prefix = replica_prefix(world.key, partition_id, replica)
                try:
                    manifest = TierManifest.load(store, prefix)
                except WaltzError as e:
                    where = f"{node.config.host}: the tier manifest of partition {partition_id}"
                    violations.append(f"{where}: {e}")
                    continue
                try:
                    local = dict(manager.partition(partition_id).segments)
                except (WaltzError, KeyError):
                    local = {}
                current = max(local) if local else None
                for first, entry in sorted(manifest.segments.items()):
                    where = f"{node.config.host}: partition {partition_id} segment {first}"
                    # Appended to after its upload, or still the one appended to (a replica cut
                    # below a copy, as a move's copy does, holds less: no sign of an open upload).
                    grew = first in local and local[first] > entry.max_transaction_id
                    if grew or (first == current and local[first] == entry.max_transaction_id):
                        violations.append(
                            f"{where} was offloaded unsealed: the tier copy ends at "
                            f"{entry.max_transaction_id}, the local segment at {local.get(first)}"
                            + (" (still the current one)" if first == current else "")
                        )
                    names = object_names(prefix, first)
                    for name, expected in zip(names, (entry.seg, entry.idx), strict=True):
                        data = world.bucket.objects.get(name, b"")
                        if hashlib.sha256(data[: expected.size]).hexdigest() != expected.sha256:
                            violations.append(f"{where}: the tier object {name} is not the bytes uploaded")
        return violations
