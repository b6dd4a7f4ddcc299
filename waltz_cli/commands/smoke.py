"""`waltz smoke`: the original's smoke test (reference §5.2) against a cluster of real processes.

A thin skin over :mod:`waltz_engine.smoke.runner`: options, console, exit code (0 only when
all seven checks pass).
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from waltz_cli.options import JsonOption
from waltz_cli.output import fail, one_line_errors, print_json
from waltz_engine.smoke.runner import DEFAULT_DURATION_S, SmokeOptions, parse_duration_s, run_smoke

SEED_BITS = 31
DIRECTORY_PREFIX = "waltz-smoke-"


def _seconds(text: str) -> float:
    # Seconds; the forms of the old --duration (90s, 30m, 2h; now a hidden alias) are read too.
    try:
        seconds = parse_duration_s(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise typer.BadParameter(f"must be more than 0, got {text!r}")
    return seconds


@one_line_errors
def smoke(
    duration_s: Annotated[
        float,
        typer.Option(
            "--duration-s",
            parser=_seconds,
            metavar="SECONDS",
            help="Seconds the clients write under faults, e.g. 1800 (30 min).",
        ),
    ] = DEFAULT_DURATION_S,
    transactions: Annotated[
        int, typer.Option("--transactions", help="Stop writing after this many (0: no limit).", min=0)
    ] = 0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Replay the fault schedule of this seed.")
    ] = None,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", "-d", help="Empty directory for the cluster and logs (default: a new one)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The smoke test: 3 storage nodes, 3 servers, 2 client processes, faults, seven checks.

    With --json the progress goes to stderr and stdout holds only the final report.

    Example: waltz smoke --duration-s 600 --seed 30303 --json
    """
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX))
    elif directory.exists() and not directory.is_dir():
        fail(f"--dir {directory} is not a directory")
    elif directory.exists() and any(directory.iterdir()):
        fail(f"--dir {directory} is not empty: give a new or empty directory (or leave --dir out)")
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
