"""`waltz top`: a live view of a cluster (a thin skin over :mod:`waltz_engine.ops.top`).

On a terminal it redraws in place; into a pipe or a file it prints plain snapshots one after
another, and with --json one JSON document per interval (JSON lines), never tables.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    cluster_command,
)
from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.ops.top import Snapshot, dev_cluster_http, render, run_live, take_snapshot, watch

DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 100
MS_PER_S = 1000
INTERRUPTED = 130


@one_line_errors
@cluster_command
def top(
    cluster: Cluster = FROM_OPTIONS,
    http: Annotated[
        list[str] | None,
        typer.Option(
            "--http", help="A node's HTTP (jetty) address host:port; repeat. Default: a dev cluster's."
        ),
    ] = None,
    interval_ms: Annotated[
        int, typer.Option("--interval-ms", "-i", min=MIN_INTERVAL_MS, help="Refresh period.")
    ] = DEFAULT_INTERVAL_MS,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print each snapshot as one JSON document (one line per interval; with --once, one).",
        ),
    ] = False,
) -> None:
    """Servers, partitions, generations, high-water marks, sessions, replica lag, rates; q quits.

    Example: waltz top

    Example: waltz top --once --json -z localhost:2181 -r /waltz --http localhost:8081

    Example: waltz top -i 5000 --json > cluster.jsonl
    """
    settings = cluster.settings()
    # A node given by --http is named by it; a dev cluster's by their data (or client) address.
    addresses = {address: address for address in http or []} or dev_cluster_http(cluster.config)
    interval_s = interval_ms / MS_PER_S
    try:
        if once:
            _show(take_snapshot(settings, addresses), as_json)
        elif as_json or not console.is_terminal:
            for snapshot in watch(settings, addresses, interval_s):
                _show(snapshot, as_json)
        else:
            run_live(settings, addresses, interval_s, Console())
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


def _show(snapshot: Snapshot, as_json: bool) -> None:
    """One snapshot, plain: JSON on one line, or tables at their own width (never redrawn)."""
    if as_json:
        print_json(snapshot.to_json())
    else:
        console.print(render(snapshot, live=False))
    sys.stdout.flush()
