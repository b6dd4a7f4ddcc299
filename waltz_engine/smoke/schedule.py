"""A seeded fault schedule for the smoke test (reference §5.2 fault kinds, §5.3 bounce rules).

The same seed and parameters always give the same schedule, so ``--seed`` replays a run's
faults exactly (their effects on a loaded machine may still differ). Invariants, for any seed:
at most one storage node is down (killed or paused) at a time, so a quorum of the three
replicas is always reachable; at most one server is down at a time; a server↔storage cut only
hits the storage node that is already down or happens while none is, for the same reason.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import Any

NUM_STORAGES = 3
NUM_SERVERS = 3
ZOOKEEPER = "zookeeper"
# Faults start after the cluster had time to mount every partition, and stop early enough that
# the last node is back before the workload ends.
DEFAULT_WARM_UP_S = 5.0
DEFAULT_COOL_DOWN_S = 10.0
DEFAULT_MIN_GAP_S = 1.5
DEFAULT_MAX_GAP_S = 4.5
DEFAULT_MIN_DOWN_S = 2.0
DEFAULT_MAX_DOWN_S = 8.0
MAX_STORAGES_DOWN = 1
MAX_SERVERS_DOWN = 1
TIME_DECIMALS = 3
# A killed server's ZooKeeper session outlives it (devcluster's 10 s timeout); while its stale
# ephemeral node holds the lowest server id nobody reassigns partitions (reference §2.3). So
# the next server fault waits that long, or the cluster spends the run coordinator-less.
SERVER_SESSION_GRACE_S = 10.0


class FaultKind(enum.Enum):
    KILL = "kill"  # kill -9, restarted after the down time
    PAUSE = "pause"  # SIGSTOP, SIGCONT after the down time
    ZOOKEEPER_RESTART = "zookeeper-restart"  # stopped, started after the down time
    CLIENT_DISCONNECT = "client-disconnect"  # every client↔server connection of one server cut
    STORAGE_DISCONNECT = "storage-disconnect"  # every server↔storage connection of one node cut
    FORGED_FRAMES = "forged-frames"  # a rogue client's forged session ids and garbage frames
    IDLE_FLOOD = "idle-flood"  # hundreds of connections that never send a byte, held, then closed
    # A bit flipped in a sealed segment of a live storage node; after the down time the record
    # must be refused there, and the partition is refilled from a healthy replica (offline on
    # that node meanwhile, so it counts as the one storage node down).
    SEALED_SEGMENT_FLIP = "sealed-segment-flip"

    @property
    def takes_down(self) -> bool:
        return self in _TAKES_DOWN


_TAKES_DOWN = (FaultKind.KILL, FaultKind.PAUSE, FaultKind.ZOOKEEPER_RESTART, FaultKind.SEALED_SEGMENT_FLIP)

# Relative weights: process faults are the point of the test, cuts are cheap and frequent.
KIND_WEIGHTS: dict[FaultKind, int] = {
    FaultKind.KILL: 4,
    FaultKind.PAUSE: 3,
    FaultKind.ZOOKEEPER_RESTART: 1,
    FaultKind.CLIENT_DISCONNECT: 2,
    FaultKind.STORAGE_DISCONNECT: 2,
    FaultKind.FORGED_FRAMES: 1,
    FaultKind.IDLE_FLOOD: 1,
    FaultKind.SEALED_SEGMENT_FLIP: 1,
}


def storage_name(index: int) -> str:
    return f"storage-{index}"


def server_name(index: int) -> str:
    return f"server-{index}"


STORAGES = tuple(storage_name(i) for i in range(NUM_STORAGES))
SERVERS = tuple(server_name(i) for i in range(NUM_SERVERS))


@dataclass(frozen=True)
class Fault:
    """``kind`` hits ``target`` at ``at_s`` (seconds after the workload started); a fault that
    takes the target down brings it back at ``at_s + down_s``."""

    at_s: float
    kind: FaultKind
    target: str
    down_s: float = 0.0

    @property
    def until_s(self) -> float:
        return self.at_s + self.down_s

    @property
    def blocks_until_s(self) -> float:
        """Until when the target counts as down for the invariants."""
        grace = SERVER_SESSION_GRACE_S if self.kind is FaultKind.KILL and self.target in SERVERS else 0.0
        return self.until_s + grace

    def describe(self) -> str:
        text = f"{self.kind.value} {self.target}"
        return f"{text} for {self.down_s:.1f}s" if self.kind.takes_down else text

    def to_json(self) -> dict[str, Any]:
        return {"at_s": self.at_s, "kind": self.kind.value, "target": self.target, "down_s": self.down_s}


@dataclass(frozen=True)
class ScheduleParams:
    duration_s: float
    warm_up_s: float = DEFAULT_WARM_UP_S
    cool_down_s: float = DEFAULT_COOL_DOWN_S
    min_gap_s: float = DEFAULT_MIN_GAP_S
    max_gap_s: float = DEFAULT_MAX_GAP_S
    min_down_s: float = DEFAULT_MIN_DOWN_S
    max_down_s: float = DEFAULT_MAX_DOWN_S

    def __post_init__(self) -> None:
        if not 0 < self.min_gap_s <= self.max_gap_s:
            raise ValueError("need 0 < min_gap_s <= max_gap_s")
        if not 0 < self.min_down_s <= self.max_down_s:
            raise ValueError("need 0 < min_down_s <= max_down_s")


def _down_at(faults: list[Fault], at_s: float, targets: tuple[str, ...], *, grace: bool = True) -> set[str]:
    """Targets down at ``at_s``; with ``grace``, a killed server until its session expired."""
    return {
        f.target
        for f in faults
        if f.kind.takes_down
        and f.target in targets
        and f.at_s <= at_s < (f.blocks_until_s if grace else f.until_s)
    }


def _candidates(kind: FaultKind, faults: list[Fault], at_s: float) -> list[str]:
    """Targets ``kind`` may hit at ``at_s`` without breaking the invariants."""
    storages_down = _down_at(faults, at_s, STORAGES)
    servers_down = _down_at(faults, at_s, SERVERS)
    if kind is FaultKind.ZOOKEEPER_RESTART:
        return [] if _down_at(faults, at_s, (ZOOKEEPER,)) else [ZOOKEEPER]
    if kind is FaultKind.CLIENT_DISCONNECT:
        return [s for s in SERVERS if s not in servers_down]
    if kind is FaultKind.STORAGE_DISCONNECT:
        return sorted(storages_down) if storages_down else list(STORAGES)
    if kind is FaultKind.FORGED_FRAMES:
        return [s for s in STORAGES if s not in storages_down]
    if kind is FaultKind.IDLE_FLOOD:
        return [n for n in STORAGES + SERVERS if n not in storages_down | servers_down]
    if kind is FaultKind.SEALED_SEGMENT_FLIP:
        return [] if len(storages_down) >= MAX_STORAGES_DOWN else list(STORAGES)
    # KILL / PAUSE: a storage node only while none is down; a server only while none is down.
    targets = [] if len(storages_down) >= MAX_STORAGES_DOWN else list(STORAGES)
    if len(servers_down) < MAX_SERVERS_DOWN:
        targets += SERVERS
    return targets


def _round(value: float) -> float:
    return round(value, TIME_DECIMALS)


def _round_down(value: float) -> float:
    """Never past the bound it was clipped to (rounding up could end after the faults' end)."""
    scale = 10.0**TIME_DECIMALS
    return math.floor(value * scale) / scale


def make_schedule(seed: int, params: ScheduleParams) -> list[Fault]:
    """The faults of one run, ordered by time; identical for identical ``seed`` and ``params``."""
    rng = random.Random(seed)
    kinds = list(KIND_WEIGHTS)
    weights = [KIND_WEIGHTS[k] for k in kinds]
    faults: list[Fault] = []
    at_s = params.warm_up_s
    last_s = params.duration_s - params.cool_down_s
    while True:
        at_s = _round(at_s + rng.uniform(params.min_gap_s, params.max_gap_s))
        if at_s >= last_s:
            return faults
        kind = rng.choices(kinds, weights)[0]
        targets = _candidates(kind, faults, at_s)
        if not targets:
            continue  # this draw would break an invariant: nothing happens at this tick
        target = rng.choice(targets)
        down_s = 0.0
        if kind.takes_down:
            # Back before the faults end, so the final checks start from a whole cluster.
            down_s = _round_down(min(rng.uniform(params.min_down_s, params.max_down_s), last_s - at_s))
        faults.append(Fault(at_s, kind, target, down_s))


def max_storages_down(faults: list[Fault]) -> int:
    """The most storage nodes down at any one instant (the invariant says at most 1)."""
    starts = [f.at_s for f in faults if f.target in STORAGES and f.kind.takes_down]
    return max((len(_down_at(faults, s, STORAGES, grace=False)) for s in starts), default=0)


def count_by_kind(faults: list[Fault]) -> dict[str, int]:
    return {kind.value: sum(1 for f in faults if f.kind is kind) for kind in FaultKind}
