"""The world's node faults keep within what the servers promise: one of them out at a time."""

from __future__ import annotations

import random
from collections.abc import Coroutine
from typing import Any

from waltz_engine.sim.node_faults import NodeFaults


class _Pick(random.Random):
    """Draws the node a fault hits: always ``pick``."""

    def __init__(self, pick: int) -> None:
        super().__init__(0)
        self.pick = pick

    def randrange(self, *args: Any, **kwargs: Any) -> int:
        return self.pick


class _Loop:
    """Records the faults started; their coroutines never run (the choice alone is tested)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def record(self, kind: str, detail: str) -> None:
        assert kind == "fault", kind
        self.started.append(detail)

    def create_task(self, coroutine: Coroutine[Any, Any, None]) -> object:
        coroutine.close()
        return object()


class _World:
    """Two servers, three storage nodes, one partition; ``out``: the servers out of service."""

    num_servers = 2
    num_storage_nodes = 3
    num_partitions = 1
    client_restarts = True
    operator_actions = False

    def __init__(self) -> None:
        self.out: set[int] = set()

    def servers_out(self) -> set[int]:
        return set(self.out)

    def owner_of(self, partition_id: int) -> int | None:
        return None


def _faults() -> tuple[NodeFaults, _Loop, _World]:
    loop, world = _Loop(), _World()
    return NodeFaults(loop, world), loop, world  # type: ignore[arg-type]


def test_no_server_fault_takes_the_last_server_in_service_out() -> None:
    """Seed 20360: server-0's storage links were frozen (a freeze begun while a bounce had paused
    it) when server-1, the partition's owner, was frozen too: no server could serve it for 24 s,
    and the client gave up. A server fault is not started while the other server is out."""
    faults, loop, world = _faults()
    world.out = {0}  # paused, frozen or crashed
    for kind in ("server_pause", "server_freeze", "server_crash"):
        faults.inject(kind, _Pick(1))
    faults.inject("partition_bounce", _Pick(0))  # it pauses one server and moves to the other
    faults.inject("server_freeze", _Pick(0))  # nor a second fault on the server already out
    assert loop.started == []
    faults.inject("storage_crash", _Pick(0))
    faults.inject("zookeeper_expiry", _Pick(1))  # a session expiry leaves the server serving
    assert loop.started == ["storage_crash storage-0", "zookeeper_expiry server-1"]


def test_a_server_fault_in_progress_counts_before_its_server_is_out() -> None:
    """A fault's task takes its server out a moment after it starts (a bounce draws its server
    then): another server fault started meanwhile would take the last one out."""
    faults, loop, world = _faults()
    faults.inject("partition_bounce", _Pick(0))
    faults.inject("server_freeze", _Pick(1))
    faults.inject("server_pause", _Pick(0))
    assert loop.started == ["partition_bounce partition-0"]
    faults._server_back("partition_bounce")  # the bounce's paused server resumed
    faults.inject("server_crash", _Pick(1))
    assert loop.started == ["partition_bounce partition-0", "server_crash server-1"]
