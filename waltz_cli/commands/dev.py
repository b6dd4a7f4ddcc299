"""`waltz dev up | status | down`: a whole local cluster (ZooKeeper, storage nodes, servers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.devcluster import (
    DEFAULT_DIRECTORY,
    DEFAULT_PARTITIONS,
    DEFAULT_SERVERS,
    DEFAULT_STORAGES,
    DEFAULT_WAIT_TIMEOUT_MS,
    ClusterStatus,
    LocalCluster,
)

STATUS_REFRESH_INTERVAL_S = 2.0

app = typer.Typer(
    help="A local development cluster: ZooKeeper, storage nodes and servers.", no_args_is_help=True
)

DirOption = Annotated[Path, typer.Option("--dir", help="Where the cluster keeps its state, data and logs.")]


@app.callback()
def _group() -> None:
    """A local development cluster: ZooKeeper, storage nodes and servers."""


def _summary(status: ClusterStatus) -> list[str]:
    lines = [f"zookeeper   {status.zookeeper}"]
    for node in status.nodes:
        ports = " ".join(f"{name}={port}" for name, port in node.ports.items())
        state = "healthy" if node.healthy else ("running" if node.running else "down")
        lines.append(f"{node.name:<11} {state:<8} pid={node.pid or '-'} {ports}")
    lines += [f"cluster     {status.cluster_root}", f"client      {status.client_config}"]
    return lines


def _status_line(status: ClusterStatus) -> str:
    marks = " ".join(f"{n.name}:{'up' if n.healthy else 'DOWN'}" for n in status.nodes)
    zk = "up" if status.zookeeper_running else "DOWN"
    return f"{time.strftime('%H:%M:%S')} zookeeper:{zk} {marks}  (Ctrl-C stops the cluster)"


@app.command("up")
@one_line_errors
def up(
    storages: Annotated[
        int | None, typer.Option("--storages", help=f"Storage nodes (default {DEFAULT_STORAGES}).", min=1)
    ] = None,
    servers: Annotated[
        int | None, typer.Option("--servers", help=f"Servers (default {DEFAULT_SERVERS}).", min=0)
    ] = None,
    partitions: Annotated[
        int | None, typer.Option("--partitions", help=f"Partitions (default {DEFAULT_PARTITIONS}).", min=1)
    ] = None,
    directory: DirOption = Path(DEFAULT_DIRECTORY),
    base_port: Annotated[
        int | None,
        typer.Option("--base-port", help="ZooKeeper here, nodes on the next ports (default: free ports)."),
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Return once the cluster is ready, leaving it running.")
    ] = False,
    timeout_ms: Annotated[
        int, typer.Option("--timeout-ms", help="Give up if not ready after this long.", min=1)
    ] = DEFAULT_WAIT_TIMEOUT_MS,
) -> None:
    """Start a local cluster (or the one already in --dir) and wait until `cluster verify` passes.

    Example: waltz dev up --detach && waltz append -p 0 hello && waltz tail -p 0 --no-follow
    """
    if LocalCluster.exists(directory):
        cluster = LocalCluster.open(directory)
        asked = (storages, servers, partitions)
        found = (len(cluster.storages), len(cluster.servers), cluster.num_partitions)
        # Explicit options must match the saved cluster (LocalCluster says how they differ).
        if any(a is not None and a != f for a, f in zip(asked, found, strict=True)):
            LocalCluster(directory, *(a if a is not None else f for a, f in zip(asked, found, strict=True)))
    else:
        cluster = LocalCluster(
            directory,
            storages or DEFAULT_STORAGES,
            servers if servers is not None else DEFAULT_SERVERS,
            partitions or DEFAULT_PARTITIONS,
            base_port,
        )
    try:
        cluster.up(timeout_ms)
    except BaseException:
        if not detach:
            cluster.down()
        raise
    for line in _summary(cluster.status()):
        typer.echo(line)
    if detach:
        return
    try:
        with console.status("", spinner="dots") as live:
            while True:
                live.update(_status_line(cluster.status()))
                time.sleep(STATUS_REFRESH_INTERVAL_S)
    except KeyboardInterrupt:
        console.print("stopping the cluster ...", markup=False)
        cluster.down()
        console.print("stopped", markup=False)


@app.command("status")
@one_line_errors
def status(
    directory: DirOption = Path(DEFAULT_DIRECTORY),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")] = False,
) -> None:
    """Processes, ports and health of the local cluster (exit 1 when anything is unhealthy)."""
    report = LocalCluster.open(directory).status()
    if as_json:
        print_json(report.to_json())
    else:
        for line in _summary(report):
            typer.echo(line)
    if not report.healthy:
        raise typer.Exit(1)


@app.command("down")
@one_line_errors
def down(
    directory: DirOption = Path(DEFAULT_DIRECTORY),
    clean: Annotated[bool, typer.Option("--clean", help="Also delete the cluster's data and logs.")] = False,
) -> None:
    """Stop servers, storage nodes and ZooKeeper (in that order)."""
    LocalCluster.open(directory).down(clean)
    console.print("stopped" + (f"; removed {directory}" if clean else ""), markup=False)
