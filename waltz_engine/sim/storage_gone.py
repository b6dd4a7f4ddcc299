"""A storage node that goes away for good (``storage_gone``): its machine and its disk are lost,
and it never returns.

A seed draws this fault from a generator of its own (``random.Random("storage_gone <seed>")``),
not from the loop's: the seeds that do not lose a node run exactly as before (their schedules
and findings unchanged), and the seeds that do lose one from then on only. Of the seeds,
:data:`AT_TIME_SHARE` lose a node at a time drawn within the faults' window, and
:data:`AFTER_MOVE_SHARE` right after one of the operator's decommissions returns (the first
after which a node is eligible: the operator's next failure after a command said "done",
where the last session's bug stalled the log).

The node lost is one of a partition's replicas of record (ZooKeeper's latest recorded session,
as the servers' recovery reads it) that the assignment still holds, and only one whose loss
leaves every partition a quorum of its replicas of record: the log is then promised to go on
(the liveness check, :mod:`waltz_engine.sim.liveness`, holds it to that). Not while another
node is away past the servers' auto-recovery grace, nor while another node's media rotted
(one failure at a time, as with ``storage_lost``, which then loses no other node in the seed).
The servers' auto-recovery moves its replicas to live nodes after the grace (the operator adds
a spare node first when none is free). Every fault and action skips it from then on, and the
checks read no replica of it.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from waltz_engine.common.errors import WaltzError
from waltz_engine.sim.operator import AUTO_RECOVERY_GRACE_MS

if TYPE_CHECKING:
    from waltz_engine.sim.node_faults import NodeFaults
    from waltz_engine.sim.world import SimWorld

AT_TIME_SHARE = 0.15
AFTER_MOVE_SHARE = 0.15
# A node not eligible at its drawn time is looked at again this often, until the window ends.
LOOK_AGAIN_S = 1.0
# How long after the loss the seed's faults wait at most for auto-recovery to re-replicate: the
# grace and 90 s more (its moves wait on ZooKeeper and on the mover lease: seed 200, with a
# ZooKeeper outage and another server's auto-recovery holding the lease, took more than 70 s),
# within the run's limit for its faults to end (seed.HEAL_LIMIT_S, 120 s).
RE_REPLICATION_LIMIT_S = AUTO_RECOVERY_GRACE_MS / 1000 + 90.0
# Once the run waits for its faults to end (seed.HEAL_LIMIT_S, 120 s), the wait ends this soon.
HEALING_S = 100.0


class StorageGone:
    """The fault's plan for one seed, and its course once it struck."""

    def __init__(self, world: SimWorld, nodes: NodeFaults, window_s: float) -> None:
        self.world = world
        self.nodes = nodes
        self.window_s = window_s
        self.rng = random.Random(f"storage_gone {world.loop.seed}")
        self.mode = ""
        self.struck = False
        self.healing_since_s: float | None = None  # when the run began waiting for its faults
        shape = world.shape
        if shape.storage_gone and shape.faults > 0 and shape.operator_actions:
            draw = self.rng.random()
            if draw < AT_TIME_SHARE:
                self.mode = "at_time"
            elif draw < AT_TIME_SHARE + AFTER_MOVE_SHARE:
                self.mode = "after_move"

    def start(self) -> None:
        if self.mode == "at_time":
            at_s = self.rng.uniform(0, self.window_s)
            self.nodes.add_healing(self.world.loop.create_task(self._at_time(at_s)))

    async def _at_time(self, at_s: float) -> None:
        world = self.world
        ends_s = world.loop.time() - at_s + self.window_s
        await asyncio.sleep(at_s)
        while not self.struck and world.loop.time() <= ends_s:
            # Not while a decommission is under way: its waits for a source or copy source lost
            # for good end only at the mover's 120 s bound, each of the operator's three tries,
            # past the run's limit for faults to end (seed 239 of the first search).
            if world.operator.busy or not (await self._spare() and self.strike()):
                await asyncio.sleep(LOOK_AGAIN_S)
        if self.struck:
            await self.re_replicated()

    async def _spare(self) -> bool:
        """Whether a live node is free for auto-recovery's moves (the operator adds one if none
        is); False while ZooKeeper is out."""
        try:
            return await self.world.operator._spare()
        except WaltzError:
            return False

    async def after_move(self) -> None:
        """The operator's decommission returned: strike now, in this turn, if the seed plans so
        (and then wait for the re-replication, in the operator's task, which the faults' end
        waits for)."""
        if self.mode == "after_move" and not self.struck and self.strike():
            await self.re_replicated()

    def _eligible(self) -> list[int]:
        world = self.world
        operator = world.operator
        if operator.lost or world.gone:
            return []
        liveness = world.liveness
        recorded = [liveness.recorded_replicas(p) for p in range(world.shape.partitions)]
        # A replica of record the assignment still holds (a source that left is no replica).
        candidates = set().union(*recorded) & liveness.assigned_hosts()
        eligible = []
        for host in sorted(candidates):
            number = int(host.rsplit("-", 1)[1])
            if host in self.nodes.busy or host in world.dead or number in world.storage_down:
                continue
            if operator._rot_elsewhere(host) or world.damaged_host == host:
                continue
            if all(len(r - {host}) >= len(r) // 2 + 1 for r in recorded if host in r):
                eligible.append(number)
        return eligible

    def strike(self) -> bool:
        """Lose an eligible node for good, now; False when none is eligible."""
        eligible = self._eligible() if not self.struck else []
        if not eligible:
            return False
        self.struck = True
        number = self.rng.choice(eligible)
        world = self.world
        host = f"storage-{number}"
        # Held for good: no other fault or action takes it, and no other node is lost past the
        # grace after it (its replicas' re-replication may not be recorded yet).
        self.nodes.busy.add(host)
        world.operator.lost.add(number)
        world.lose_storage(number)
        return True

    async def re_replicated(self) -> None:
        """Until the assignment no longer holds the lost node (the servers' auto-recovery moved
        its replicas), for at most RE_REPLICATION_LIMIT_S: the seed's faults end after it."""
        world = self.world
        waited_s = 0.0
        while world.liveness.gone_still_assigned() and waited_s < RE_REPLICATION_LIMIT_S:
            if self.healing_since_s is not None and world.loop.time() >= self.healing_since_s + HEALING_S:
                return  # (the run's limit for its faults to end comes first: seeds 88, 120)
            await asyncio.sleep(LOOK_AGAIN_S)
            waited_s += LOOK_AGAIN_S
