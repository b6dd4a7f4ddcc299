"""`waltz smoke`: the original's smoke test (reference §5.2) against a cluster of real processes.

A thin skin over :mod:`waltz_engine.smoke.runner`: options, console, exit code (0 only when
all six checks pass).
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from waltz_cli.output import fail, print_json
from waltz_engine.smoke.runner import DEFAULT_DURATION_S, SmokeOptions, parse_duration_s, run_smoke

SEED_BITS = 31
DIRECTORY_PREFIX = "waltz-smoke-"


def smoke(
    duration: Annotated[
        str, typer.Option("--duration", help="How long the clients write under faults: 90s, 30m, 2h.")
    ] = f"{DEFAULT_DURATION_S:.0f}s",
    transactions: Annotated[
        int, typer.Option("--transactions", help="Stop writing after this many (0: no limit).", min=0)
    ] = 0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Replay the fault schedule of this seed.")
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Empty directory for the cluster and logs (default: a new one)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The final report as JSON on stdout.")] = False,
) -> None:
    """The smoke test: 3 storage nodes, 3 servers, 2 client processes, faults, six checks."""
    try:
        duration_s = parse_duration_s(duration)
    except ValueError:
        fail(f"--duration {duration!r} is not a duration (e.g. 120s, 30m)")
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX))
    elif directory.exists() and any(directory.iterdir()):
        fail(f"--dir {directory} is not empty")
    options = SmokeOptions(
        directory.resolve(),
        seed if seed is not None else random.getrandbits(SEED_BITS),
        duration_s,
        transactions,
    )

    def console(line: str) -> None:
        # With --json the console goes to stderr, so stdout is only the report.
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    report = run_smoke(options, console)
    if as_json:
        print_json(report.to_json())
    else:
        for line in report.lines():
            console(line)
    raise typer.Exit(0 if report.passed else 1)
