"""`waltz top`: a live view of a cluster (a thin skin over :mod:`waltz_engine.top`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from waltz_cli.commands.zk import ConfigOption, RootOption, ZooKeeperOption
from waltz_cli.output import one_line_errors, print_json
from waltz_engine.smoke.runner import parse_duration_s
from waltz_engine.top import dev_cluster_http, render, run_live, take_snapshot
from waltz_engine.zk.connection import load_settings

DEFAULT_INTERVAL = "1s"
MIN_INTERVAL_S = 0.1
INTERRUPTED = 130


@one_line_errors
def top(
    config: ConfigOption = None,
    zookeeper: ZooKeeperOption = None,
    root: RootOption = None,
    http: Annotated[
        list[str] | None,
        typer.Option(
            "--http", help="A node's HTTP (jetty) address host:port; repeat. Default: a dev cluster's."
        ),
    ] = None,
    interval: Annotated[
        str, typer.Option("--interval", help="Refresh period, e.g. 1s, 500ms.")
    ] = DEFAULT_INTERVAL,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --once: the snapshot as JSON.")] = False,
) -> None:
    """Servers, partitions, generations, high-water marks, sessions, replica lag, rates; q quits."""
    settings = load_settings(config, zookeeper, root)
    addresses = list(http or []) or (dev_cluster_http(config) if config is not None else [])
    if once:
        snapshot = take_snapshot(settings, addresses)
        if as_json:
            print_json(snapshot.to_json())
        else:
            Console().print(render(snapshot))
        return
    interval_s = max(MIN_INTERVAL_S, parse_duration_s(interval))
    try:
        run_live(settings, addresses, interval_s, Console())
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
