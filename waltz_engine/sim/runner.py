"""Many seeds of the simulator, one after another or over several processes: ``waltz sim``.

Each seed is :func:`waltz_engine.sim.world.run_seed`; the report's trace hash is over every
seed's, in seed order, so two runs with the same arguments print the same hash whatever
``jobs`` is. A failing seed carries its replay command and its last events in words.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from waltz_engine.sim.world import SeedResult, WorldShape, run_seed

MAX_JOBS = 64
MAX_SEEDS = 1_000_000


@dataclass
class SimReport:
    seeds: int
    seed_base: int
    transactions: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    virtual_s: float = 0.0
    cpu_s: float = 0.0
    violations: list[dict[str, Any]] = field(default_factory=list)
    failing_seeds: list[int] = field(default_factory=list)
    trace_hash: str = ""

    @property
    def passed(self) -> bool:
        return not self.failing_seeds

    @property
    def cpu_s_per_seed(self) -> float:
        """The CPU a seed took on average (what a long search costs: seeds x this / processes)."""
        return self.cpu_s / self.seeds

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "seed_base": self.seed_base,
            "transactions": self.transactions,
            "faults": dict(sorted(self.faults.items())),
            "simulated_s": round(self.virtual_s, 6),
            "cpu_s": round(self.cpu_s, 3),
            "cpu_s_per_seed": round(self.cpu_s_per_seed, 4),
            "violations": self.violations,
            "failing_seeds": self.failing_seeds,
            "trace_hash": self.trace_hash,
        }

    def lines(self) -> list[str]:
        lines = [
            f"{self.seeds} seeds from {self.seed_base}: {self.transactions} transactions, "
            f"{sum(self.faults.values())} faults, "
            f"{self.virtual_s:.1f} s simulated in {self.cpu_s:.1f} s of CPU "
            f"({self.cpu_s_per_seed:.3f} s a seed)",
            f"trace hash {self.trace_hash}",
        ]
        for violation in self.violations:
            lines.append(f"seed {violation['seed']}: {violation['violation']}")
            lines.append(f"  replay: {violation['replay']}")
            lines.extend(f"  {event}" for event in violation["last_events"])
        lines.append("no violations" if self.passed else f"{len(self.failing_seeds)} failing seeds")
        return lines


def replay_command(seed: int, shape: WorldShape) -> str:
    command = (
        f"waltz sim --seeds 1 --seed-base {seed} --transactions {shape.transactions} --faults {shape.faults}"
    )
    command = command if shape.workload == "append" else f"{command} --workload {shape.workload}"
    if shape.submits_together > 1:  # (`--partitions N` submits N at once: waltz_cli's sim)
        command = f"{command} --partitions {shape.submits_together}"
    return f"{command} --acl" if shape.acl else command


def run_seeds(
    count: int,
    seed_base: int = 0,
    jobs: int = 1,
    on_seed: Callable[[SeedResult], None] | None = None,
    shape: WorldShape | None = None,
) -> SimReport:
    """Run seeds ``seed_base`` .. ``seed_base + count - 1`` of worlds of ``shape``, on ``jobs`` processes."""
    shape = shape or WorldShape()
    if not 1 <= count <= MAX_SEEDS:
        raise ValueError(f"seeds must be in 1..{MAX_SEEDS}, got {count}")
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs must be in 1..{MAX_JOBS}, got {jobs}")
    seeds = range(seed_base, seed_base + count)
    report = SimReport(count, seed_base)
    trace = hashlib.blake2b(digest_size=16)
    # One task per seed (seeds vary tenfold in cost, so larger chunks would leave a process idle
    # at the end); the processes start once and run seed after seed.
    with ProcessPoolExecutor(jobs) if jobs > 1 else _Inline() as pool:
        for result in pool.map(functools.partial(run_seed, shape=shape), seeds):
            trace.update(bytes.fromhex(result.trace_hash))
            report.transactions += result.transactions
            report.virtual_s += result.virtual_s
            for kind, injected in result.faults.items():
                report.faults[kind] = report.faults.get(kind, 0) + injected
            report.cpu_s += result.cpu_s
            if result.violations:
                report.failing_seeds.append(result.seed)
                report.violations.extend(
                    {
                        "seed": result.seed,
                        "violation": violation,
                        "replay": replay_command(result.seed, shape),
                        "last_events": result.last_events,
                    }
                    for violation in result.violations
                )
            if on_seed is not None:
                on_seed(result)
    report.trace_hash = trace.hexdigest()
    return report


class _Inline:
    """``map`` in this process, in order (one job: no process to start)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def map(self, function: Callable[[int], SeedResult], items: Iterable[int]) -> Iterable[SeedResult]:
        return map(function, items)
