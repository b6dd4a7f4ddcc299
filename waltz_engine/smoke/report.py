"""The smoke test's final report: what ran, what it measured, what the seven checks found."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from waltz_engine.smoke.checks import CheckResult
from waltz_engine.smoke.schedule import Fault

PERCENTILE_CUTS = 100
NUM_CHECKS = 7  # the six of reference §5.2 and the outcome contract (not-committed-absent)


def percentile(values: list[float], percent: int) -> float:
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=PERCENTILE_CUTS, method="inclusive")[percent - 1]


@dataclass
class SmokeReport:
    seed: int
    directory: str
    schedule: list[Fault]
    faults_injected: dict[str, int] = field(default_factory=dict)
    # Faults whose target was down (another fault's doing) when their time came.
    faults_skipped: dict[str, int] = field(default_factory=dict)
    write_elapsed_s: float = 0.0
    committed: int = 0
    failed: int = 0
    retries: int = 0
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    verify_elapsed_s: float = 0.0
    high_water_marks: dict[int, int] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    error: str = ""

    @property
    def tps(self) -> float:
        return self.committed / self.write_elapsed_s if self.write_elapsed_s > 0 else 0.0

    @property
    def passed(self) -> bool:
        return not self.error and len(self.checks) == NUM_CHECKS and all(c.ok for c in self.checks)

    def lines(self) -> list[str]:
        faults = " ".join(f"{kind}={n}" for kind, n in self.faults_injected.items())
        skipped = " ".join(f"{kind}={n}" for kind, n in self.faults_skipped.items())
        lines = [
            f"% SEED {self.seed} (directory {self.directory})",
            f"% FAULTS total={sum(self.faults_injected.values())} {faults}",
            *(
                [f"% SKIPPED total={sum(self.faults_skipped.values())} {skipped} (target down)"]
                if sum(self.faults_skipped.values())
                else []
            ),
            f"% WRITE elapsed[s]={self.write_elapsed_s:.1f} transactions={self.committed} "
            f"tps={self.tps:.1f} latency[ms] p50={self.latency_p50_ms:.1f} p99={self.latency_p99_ms:.1f} "
            f"retries={self.retries} failed={self.failed}",
            f"% VERIFICATION elapsed[s]={self.verify_elapsed_s:.1f} hwmarks={self.high_water_marks}",
            *(f"% CHECK {check.line()}" for check in self.checks),
        ]
        if self.error:
            lines.append(f"% ERROR {self.error}")
        lines.append(f"% RESULT {'PASSED' if self.passed else 'FAILED'}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "directory": self.directory,
            "schedule": [f.to_json() for f in self.schedule],
            "faults_injected": self.faults_injected,
            "faults_skipped": self.faults_skipped,
            "write_elapsed_s": round(self.write_elapsed_s, 3),
            "transactions": self.committed,
            "failed": self.failed,
            "retries": self.retries,
            "tps": round(self.tps, 3),
            "latency_p50_ms": _finite(self.latency_p50_ms),
            "latency_p99_ms": _finite(self.latency_p99_ms),
            "verify_elapsed_s": round(self.verify_elapsed_s, 3),
            "high_water_marks": self.high_water_marks,
            "checks": [c.to_json() for c in self.checks],
            "error": self.error,
            "passed": self.passed,
        }


def _finite(value: float) -> float | None:
    """JSON has no NaN: no measurement is null."""
    return None if math.isnan(value) else round(value, 3)
