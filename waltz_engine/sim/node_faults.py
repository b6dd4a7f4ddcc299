"""Faults of whole nodes, every choice drawn from the seed's generator.

- ``server_pause``: a server stops being heard (its connections stall both ways, ZooKeeper loses
  it) for a while; a pause longer than the session timeout expires its ZooKeeper session, and the
  cluster manager moves its partitions away and, after the pause, back.
- ``zookeeper_expiry``: ZooKeeper expires a server's session now (its partitions move).
- ``forced_assignment``: an operator pins a partition to a server for a while (the partition
  moves there, then back to the policy's choice).
- ``partition_bounce``: a server pauses (shorter than its session timeout, so it stays a member)
  while a partition is pinned to another server and then back to it: on resuming it sees only the
  newest assignment of a partition another server wrote to meanwhile (the path of issue 21 item 1).
- ``forged_read``: a rogue client with the cluster key reads every partition of every storage
  node with a session id ZooKeeper never issued (it must be refused, never fence a replica).
- ``client_restart``: the application's process restarts; a new client resumes from the
  high-water mark the application stored with its state (contexts in flight end unknown).
- ``storage_crash`` / ``server_crash``: the machine loses power: at once (for a storage node,
  wherever it is between a write, its sync and its acknowledgement), or for a storage node now
  and then inside one of its next writes. Nothing it would say crosses, its disk keeps only what
  was synced (and a torn piece of the last write), its ZooKeeper session expires in its time,
  none of its code runs again; a new process starts on what stayed.
- ``server_freeze``: the links of a partition's owner to the storage nodes stall longer than its ZooKeeper
  session lasts, and no connection gives up on them: it goes on taking appends, its partitions
  move on, and what it sent arrives after, at fenced replicas.
- Disk faults of a storage node: ``torn_write`` (the power goes inside one of its next writes),
  ``bit_flip`` (rot in a segment, sealed or open up to its durable point, or in the control
  file's partition structs; always the same node in a seed), ``disk_full`` (writes that grow a
  file fail with ENOSPC for a while), ``slow_sync`` (each fsync takes up to seconds for a while),
  ``whole_sync_failure`` (the node's next whole-disk syncs fail with EIO, making nothing durable:
  only where its disk passes sync several partitions together, the world that submits several
  transactions at once; issue 33).

The world (:class:`waltz_engine.sim.world.SimWorld`) does what a fault means to its nodes; this
module only chooses and times them, and heals each.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Protocol

from waltz_engine.sim.loop import SimLoop
from waltz_engine.sim.operator import OPERATOR_KINDS
from waltz_engine.sim.world_constants import CLIENT_HOST, ROGUE_HOST, SESSION_TIMEOUT_MS

NODE_FAULT_KINDS = (
    "server_pause",
    "zookeeper_expiry",
    "forced_assignment",
    "partition_bounce",
    "storage_crash",
    "server_crash",
    "forged_read",
    "client_restart",
    "server_freeze",
    "torn_write",
    "bit_flip",
    "disk_full",
    "slow_sync",
    "whole_sync_failure",
)
STORAGE_KINDS = ("storage_crash", "torn_write", "bit_flip", "disk_full", "slow_sync", "whole_sync_failure")
# Only in a world whose disk passes sync several partitions together (the others never take it,
# and keep their schedules).
WHOLE_SYNC_KINDS = ("whole_sync_failure",)
# A whole-sync failure fails this many of the node's next whole-disk syncs.
WHOLE_SYNC_FAILURES = (1, 3)
# Moving a partition needs a second server.
MOVING_KINDS = ("forced_assignment", "partition_bounce")
# Kinds that take a server out of service while they last (a bounce pauses one of them).
SERVER_OUT_KINDS = ("server_pause", "server_freeze", "server_crash", "partition_bounce")
CLIENT_KINDS = ("client_restart",)
MIN_PAUSE_S = 0.5
MAX_PAUSE_S = 25.0  # beyond the simulated session timeout: some pauses expire the session
MAX_FORCED_S = 30.0
MAX_BOUNCE_PAUSE_S = 4.0  # a bounce's pause stays within the session timeout
MAX_DOWN_S = 5.0  # a crashed node's restart comes this long after at most
# A freeze outlasts the simulated session timeout, without any connection reset.
MIN_FREEZE_S = 11.0
MAX_FREEZE_S = 30.0
MAX_ZOOKEEPER_RECONNECT_S = 3.0
MAX_DISK_FAULT_S = 20.0
assert MAX_PAUSE_S * 1000 > SESSION_TIMEOUT_MS, "some pauses must expire the session"
assert MAX_BOUNCE_PAUSE_S * 1000 < SESSION_TIMEOUT_MS, "a bounce's pause must keep the session"
assert MIN_FREEZE_S * 1000 > SESSION_TIMEOUT_MS, "every freeze must outlast the session"


class NodeWorld(Protocol):
    """What a node fault does to the world's nodes."""

    @property
    def num_servers(self) -> int: ...

    @property
    def num_storage_nodes(self) -> int: ...

    @property
    def num_partitions(self) -> int: ...

    @property
    def client_restarts(self) -> bool: ...

    @property
    def whole_syncs(self) -> bool:
        """Whether the storage nodes' disk passes often sync several partitions together."""

    def fail_whole_syncs(self, index: int, count: int) -> None: ...

    def servers_out(self) -> set[int]:
        """The servers out of service now (paused, frozen, crashed and not restarted)."""

    def pause_server(self, index: int) -> None: ...

    def resume_server(self, index: int) -> None: ...

    def expire_server_session(self, index: int) -> None: ...

    async def force_assign(self, partition_id: int, index: int) -> None: ...

    async def force_unassign(self, partition_id: int) -> None: ...

    async def crash_storage(self, index: int, mid_write: bool | None = None) -> None: ...

    def owner_of(self, partition_id: int) -> int | None: ...

    def freeze_server(self, index: int) -> None: ...

    def thaw_server(self, index: int) -> None: ...

    def flip_bit(self, index: int) -> None: ...

    def fill_disk(self, index: int) -> None: ...

    def free_disk(self, index: int) -> None: ...

    def slow_syncs(self, index: int, slow: bool, duration_s: float = 0.0) -> None: ...

    async def restart_storage(self, index: int) -> None: ...

    async def crash_server(self, index: int) -> None: ...

    async def forge_reads(self) -> None: ...

    async def restart_server(self, index: int) -> None: ...

    async def restart_client(self) -> None: ...

    @property
    def operator_actions(self) -> bool: ...

    def operate(self, kind: str, rng: random.Random, busy: set[str]) -> asyncio.Task[None] | None:
        """Start the operator's action ``kind`` (waltz_engine.sim.operator); None: not now."""


def node_fault_kinds(world: NodeWorld) -> tuple[str, ...]:
    """The kinds that make sense in ``world``: moving a partition needs a second server; the
    client restarts unless the world was shaped without (the seeds found before they existed); a
    whole-disk sync fails only where passes sync several partitions together."""
    left_out = (
        (MOVING_KINDS if world.num_servers < 2 else ())
        + (() if world.client_restarts else CLIENT_KINDS)
        + (() if world.whole_syncs else WHOLE_SYNC_KINDS)
    )
    kinds = tuple(kind for kind in NODE_FAULT_KINDS if kind not in left_out)
    return kinds + (OPERATOR_KINDS if world.operator_actions else ())


class NodeFaults:
    """Starts node faults and keeps the tasks that heal them; :meth:`finish` heals what is left."""

    def __init__(self, loop: SimLoop, world: NodeWorld) -> None:
        self.loop = loop
        self.world = world
        self._healing: list[asyncio.Task[None]] = []
        self._busy: set[str] = set()  # a node with a fault in progress takes no other
        # Faults of SERVER_OUT_KINDS whose server is not back yet (counted from their start: a
        # bounce draws its server later).
        self._taking_out = 0

    @property
    def busy(self) -> set[str]:
        """The nodes with a fault in progress (a node gone for good stays in it)."""
        return self._busy

    def add_healing(self, task: asyncio.Task[None] | asyncio.Task[bool]) -> None:
        """A fault's task started elsewhere (``storage_gone``): :meth:`finish` waits for it too."""
        self._healing.append(task)  # type: ignore[arg-type]

    def inject(self, kind: str, rng: random.Random) -> None:
        world = self.world
        if kind in OPERATOR_KINDS:
            task = world.operate(kind, rng, self._busy)
            if task is not None:
                self._healing.append(task)
            return
        if kind == "forged_read":
            node = ROGUE_HOST
        elif kind == "client_restart":
            node = CLIENT_HOST
        elif kind in STORAGE_KINDS:
            node = f"storage-{rng.randrange(world.num_storage_nodes)}"
        elif kind in MOVING_KINDS:
            node = f"partition-{rng.randrange(world.num_partitions)}"
        elif kind == "server_freeze":
            # The owner of a partition: a freeze matters where appends are in flight.
            owner = world.owner_of(rng.randrange(world.num_partitions))
            node = f"server-{rng.randrange(world.num_servers) if owner is None else owner}"
        else:
            node = f"server-{rng.randrange(world.num_servers)}"
        index = int(node.rsplit("-", 1)[1])
        if node in self._busy:
            return
        if kind in SERVER_OUT_KINDS and not self._one_serves_beside(kind, index):
            return
        self._busy.add(node)
        self._taking_out += kind in SERVER_OUT_KINDS
        self.loop.record("fault", f"{kind} {node}")
        self._healing.append(self.loop.create_task(self._run(kind, node, index, rng)))

    def _one_serves_beside(self, kind: str, index: int) -> bool:
        """Whether a server stays in service while ``kind`` takes one out: the servers promise to
        outlive one of them failing (another takes its partitions), not all at once. With every
        server out no partition is served, whatever the product does; the client's appends then
        wait past its patience (issue 32: the simulator's seed 20360, where both servers' storage
        links were frozen for 24 s at once, and a freeze began on a server a bounce had paused,
        whose end then healed the frozen server's ZooKeeper session)."""
        out = self.world.servers_out()
        if kind != "partition_bounce" and index in out:
            return False
        # Each fault in progress counts as one server out (it may not have taken it out yet);
        # with the world's two servers: no other server fault in progress, and none out.
        return max(len(out), self._taking_out) + 1 < self.world.num_servers

    def _server_back(self, kind: str) -> None:
        """The server a fault of ``kind`` took out is back in service (once per fault)."""
        if kind in SERVER_OUT_KINDS:
            self._taking_out -= 1

    async def _run(self, kind: str, node: str, index: int, rng: random.Random) -> None:
        world = self.world
        back = False
        try:
            if kind == "server_pause":
                world.pause_server(index)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_PAUSE_S))
                world.resume_server(index)
            elif kind == "zookeeper_expiry":
                world.expire_server_session(index)
            elif kind == "forced_assignment":
                await world.force_assign(index, rng.randrange(world.num_servers))
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_FORCED_S))
                await world.force_unassign(index)
            elif kind == "forged_read":
                await world.forge_reads()
            elif kind == "client_restart":
                await world.restart_client()
            elif kind == "partition_bounce":
                back = True  # the bounce tells when its server resumed
                await self._bounce(index, rng, lambda: self._server_back(kind))
            elif kind in ("storage_crash", "torn_write"):
                await world.crash_storage(index, True if kind == "torn_write" else None)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_DOWN_S))
                await world.restart_storage(index)
            elif kind == "server_freeze":
                world.freeze_server(index)
                await asyncio.sleep(rng.uniform(MIN_FREEZE_S, MAX_FREEZE_S))
                world.thaw_server(index)
                # Its connections carry what it sent at once; ZooKeeper's reconnect takes a moment
                # (it learns its session expired only then), so a deposed server may act meanwhile.
                await asyncio.sleep(rng.uniform(0.0, MAX_ZOOKEEPER_RECONNECT_S))
                world.resume_server(index)
            elif kind == "bit_flip":
                world.flip_bit(index)
            elif kind == "disk_full":
                world.fill_disk(index)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_DISK_FAULT_S))
                world.free_disk(index)
            elif kind == "whole_sync_failure":
                world.fail_whole_syncs(index, rng.randint(*WHOLE_SYNC_FAILURES))
            elif kind == "slow_sync":
                slow_s = rng.uniform(MIN_PAUSE_S, MAX_DISK_FAULT_S)
                world.slow_syncs(index, True, slow_s)
                await asyncio.sleep(slow_s)
                world.slow_syncs(index, False)
            else:
                await world.crash_server(index)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_DOWN_S))
                await world.restart_server(index)
        finally:
            if not back:
                self._server_back(kind)
            self._busy.discard(node)

    async def _bounce(self, partition_id: int, rng: random.Random, resumed: Callable[[], None]) -> None:
        world = self.world
        paused = rng.randrange(world.num_servers)
        other = (paused + 1 + rng.randrange(world.num_servers - 1)) % world.num_servers
        pause_s = rng.uniform(MIN_PAUSE_S, MAX_BOUNCE_PAUSE_S)
        try:
            world.pause_server(paused)
            await world.force_assign(partition_id, other)
            await asyncio.sleep(rng.uniform(0, pause_s))
            await world.force_assign(partition_id, paused)
            await asyncio.sleep(pause_s)
            world.resume_server(paused)
        finally:
            resumed()
        await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_FORCED_S))
        await world.force_unassign(partition_id)

    async def finish(self) -> None:
        """Every fault healed: the nodes restarted, resumed, the partitions back to the policy;
        then the first error a healing raised, if one did."""
        results = await asyncio.gather(*self._healing, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result
