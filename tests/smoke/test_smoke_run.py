"""`waltz smoke` end to end: fifty seconds of writes under every kind of fault, zero violations.

The suite runs the shortest schedule that still injects every fault kind; the two-minute run of
issue 20 (`waltz smoke --duration-s 120 --seed 20261122`, 20+ faults) is a documented command
(docs/smoke.md), too long for a suite that must finish in minutes on 2 cores.

Real processes throughout (ZooKeeper, 3 storage nodes, 3 servers, 2 client processes, the
runner with its proxies), driven through the command line as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SEED = 72  # in fifty seconds, a schedule with every fault kind (12 faults; the most of seeds 1-200)
DURATION_S = "50"
MIN_FAULTS = 12
NUM_CHECKS = 7
# The writes, cluster start, drain, a full restart for the re-read: bounded well
# above what a loaded 2-core machine needs, so a hang fails instead of blocking the suite.
RUN_TIMEOUT_S = 600.0

SMOKE_MAIN = """
import sys, typer
from waltz_cli.commands.smoke import smoke
app = typer.Typer(pretty_exceptions_enable=False)
app.command()(smoke)
sys.argv[0] = "waltz smoke"
app()
"""


@pytest.mark.slow
def test_every_kind_of_fault_passes_all_seven_checks(tmp_path: Path) -> None:
    directory = tmp_path / "smoke"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SMOKE_MAIN,
            "--duration-s",
            DURATION_S,
            "--seed",
            str(SEED),
            "--dir",
            str(directory),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    report = json.loads(result.stdout)
    console = result.stderr
    assert f"seed {SEED}" in console and "fault schedule" in console
    assert report["seed"] == SEED
    assert report["error"] == "", console[-3000:]
    assert sum(report["faults_injected"].values()) >= MIN_FAULTS, report["faults_injected"]
    assert all(report["faults_injected"][kind] > 0 for kind in report["faults_injected"]), report[
        "faults_injected"
    ]
    assert report["transactions"] > 0
    assert len(report["checks"]) == NUM_CHECKS
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, failed
    assert report["passed"] and result.returncode == 0
