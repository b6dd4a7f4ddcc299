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
- ``storage_crash`` / ``server_crash``: the node dies (it is cut off first, so nothing it says on
  the way out crosses), a storage node loses its unsynced writes (``SimDisk.crash``), and a new
  process starts on what stayed.

The world (:class:`waltz_engine.sim.world.SimWorld`) does what a fault means to its nodes; this
module only chooses and times them, and heals each.
"""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

from waltz_engine.sim.loop import SimLoop
from waltz_engine.sim.operator import OPERATOR_KINDS

NODE_FAULT_KINDS = (
    "server_pause",
    "zookeeper_expiry",
    "forced_assignment",
    "partition_bounce",
    "storage_crash",
    "server_crash",
    "forged_read",
    "client_restart",
)
# Moving a partition needs a second server.
MOVING_KINDS = ("forced_assignment", "partition_bounce")
CLIENT_KINDS = ("client_restart",)
MIN_PAUSE_S = 0.5
MAX_PAUSE_S = 25.0  # beyond the simulated session timeout: some pauses expire the session
MAX_FORCED_S = 30.0
MAX_BOUNCE_PAUSE_S = 4.0  # a bounce's pause stays within the session timeout
MAX_DOWN_S = 5.0  # a crashed node's restart comes this long after at most


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

    def pause_server(self, index: int) -> None: ...

    def resume_server(self, index: int) -> None: ...

    def expire_server_session(self, index: int) -> None: ...

    async def force_assign(self, partition_id: int, index: int) -> None: ...

    async def force_unassign(self, partition_id: int) -> None: ...

    async def crash_storage(self, index: int) -> None: ...

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
    client restarts unless the world was shaped without (the seeds found before they existed)."""
    left_out = (MOVING_KINDS if world.num_servers < 2 else ()) + (
        () if world.client_restarts else CLIENT_KINDS
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

    def inject(self, kind: str, rng: random.Random) -> None:
        world = self.world
        if kind in OPERATOR_KINDS:
            task = world.operate(kind, rng, self._busy)
            if task is not None:
                self._healing.append(task)
            return
        if kind == "forged_read":
            node = "rogue-0"
        elif kind == "client_restart":
            node = "client-0"
        elif kind == "storage_crash":
            node = f"storage-{rng.randrange(world.num_storage_nodes)}"
        elif kind in MOVING_KINDS:
            node = f"partition-{rng.randrange(world.num_partitions)}"
        else:
            node = f"server-{rng.randrange(world.num_servers)}"
        index = int(node.rsplit("-", 1)[1])
        if node in self._busy:
            return
        self._busy.add(node)
        self.loop.record("fault", f"{kind} {node}")
        self._healing.append(self.loop.create_task(self._run(kind, node, index, rng)))

    async def _run(self, kind: str, node: str, index: int, rng: random.Random) -> None:
        world = self.world
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
                await self._bounce(index, rng)
            elif kind == "storage_crash":
                await world.crash_storage(index)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_DOWN_S))
                await world.restart_storage(index)
            else:
                await world.crash_server(index)
                await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_DOWN_S))
                await world.restart_server(index)
        finally:
            self._busy.discard(node)

    async def _bounce(self, partition_id: int, rng: random.Random) -> None:
        world = self.world
        paused = rng.randrange(world.num_servers)
        other = (paused + 1 + rng.randrange(world.num_servers - 1)) % world.num_servers
        pause_s = rng.uniform(MIN_PAUSE_S, MAX_BOUNCE_PAUSE_S)
        world.pause_server(paused)
        await world.force_assign(partition_id, other)
        await asyncio.sleep(rng.uniform(0, pause_s))
        await world.force_assign(partition_id, paused)
        await asyncio.sleep(pause_s)
        world.resume_server(paused)
        await asyncio.sleep(rng.uniform(MIN_PAUSE_S, MAX_FORCED_S))
        await world.force_unassign(partition_id)

    async def finish(self) -> None:
        """Every fault healed: the nodes restarted, resumed, the partitions back to the policy."""
        for task in self._healing:
            await task
