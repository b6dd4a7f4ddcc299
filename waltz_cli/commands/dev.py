"""`waltz dev up | status | down`: a whole local cluster (ZooKeeper, storage nodes, servers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from waltz_cli import options
from waltz_cli.options import JsonOption
from waltz_cli.output import console, err_console, one_line_errors, print_json, warn
from waltz_engine.ops.devcluster import (
    DEFAULT_DIRECTORY,
    DEFAULT_PARTITIONS,
    DEFAULT_SERVERS,
    DEFAULT_STORAGES,
    DEFAULT_WAIT_TIMEOUT_MS,
    STATE_FILE_NAME,
    ClusterStatus,
    DevClusterError,
    LocalCluster,
)
from waltz_engine.ops.devcluster.settings import parse_setting, unknown_keys

STATUS_REFRESH_INTERVAL_S = 2.0

app = options.group(help="A local development cluster: ZooKeeper, storage nodes and servers.")


class Setting(NamedTuple):
    key: str
    value: Any


def _setting(text: str) -> Setting:
    try:
        return Setting(*parse_setting(text))
    except DevClusterError as e:
        raise typer.BadParameter(str(e)) from None


DirOption = Annotated[
    Path, typer.Option("--dir", "-d", help="Where the cluster keeps its state, data and logs.")
]


def _summary(status: ClusterStatus) -> list[str]:
    zookeeper = "running" if status.zookeeper_running else "down"
    lines = [f"zookeeper   {zookeeper:<8} {status.zookeeper}"]
    for node in status.nodes:
        ports = " ".join(f"{name}={port}" for name, port in node.ports.items())
        state = "healthy" if node.healthy else ("running" if node.running else "down")
        data = f" data={node.data_dir}" if node.data_dir is not None else ""
        lines.append(f"{node.name:<11} {state:<8} pid={node.pid or '-'} {ports}{data}")
    lines += [f"cluster     {status.cluster_root}", f"client      {status.client_config}"]
    return lines


def _verdict(status: ClusterStatus, directory: Path) -> str | None:
    """What is wrong with the cluster, in words, and what to do; None when it is healthy."""
    if status.healthy:
        return None
    up = f"start it with `waltz dev up --detach --dir {directory}`"
    nodes_up = [n for n in status.nodes if n.running]
    if not status.zookeeper_running and not nodes_up:
        return f"the cluster is down (ZooKeeper and every node): {up}"
    if not status.zookeeper_running:
        return f"ZooKeeper at {status.zookeeper} is down, so the nodes cannot coordinate: {up}"
    unhealthy = ", ".join(n.name for n in status.nodes if not n.healthy)
    return f"not healthy: {unhealthy} (see their logs under {directory}); {up}"


def _status_line(status: ClusterStatus) -> str:
    marks = " ".join(f"{n.name}:{'up' if n.healthy else 'DOWN'}" for n in status.nodes)
    zk = "up" if status.zookeeper_running else "DOWN"
    return f"{time.strftime('%H:%M:%S')} zookeeper:{zk} {marks}  (Ctrl-C stops the cluster)"


# A dev cluster re-replicates a storage node lost for 10 s (a production server waits 10 minutes).
DEV_SERVER_CONFIG = {"server.autoRecovery.graceMs": 10_000}


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
    replicas: Annotated[
        int | None,
        typer.Option("--replicas", help="Storage nodes holding each partition (default: all).", min=1),
    ] = None,
    settings: Annotated[
        list[Setting] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            parser=_setting,
            help="A configuration key for the YAML of the nodes that read it (storage nodes or servers), "
            "e.g. storage.segment.size.threshold=1048576 (repeatable; saved with the cluster).",
        ),
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
    as_json: JsonOption = False,
) -> None:
    """Start a local cluster (or the one already in --dir) and wait until `cluster verify` passes.

    --dir must be new, empty, or hold a cluster `dev up` made; a port in use stops it with
    everything it started. With --json the cluster's status is printed once it is ready (and
    the live status line, without --detach, goes to stderr).

    Example: waltz dev up --detach && waltz append -p 0 hello && waltz tail -p 0 --no-follow
    """
    given = None if settings is None else dict(settings)
    if LocalCluster.exists(directory):
        saved = LocalCluster.open(directory)
        # Explicit options must match the saved cluster (LocalCluster says how they differ);
        # --set replaces the saved keys of a stopped cluster.
        storages, servers, partitions, replicas = (
            asked if asked is not None else found
            for asked, found in zip(
                (storages, servers, partitions, replicas),
                (len(saved.storages), len(saved.servers), saved.num_partitions, saved.replicas),
                strict=True,
            )
        )
        cluster = LocalCluster(
            directory,
            storages,
            servers,
            partitions,
            replicas=replicas,
            settings=given,
            server_config=DEV_SERVER_CONFIG,
        )
    else:
        cluster = LocalCluster(
            directory,
            storages or DEFAULT_STORAGES,
            servers if servers is not None else DEFAULT_SERVERS,
            partitions or DEFAULT_PARTITIONS,
            base_port,
            replicas=replicas,
            settings=given,
            server_config=DEV_SERVER_CONFIG,
        )
    for key in unknown_keys(cluster.settings):
        warn(f"--set {key}: no storage node or server knows this key; they will ignore it")
    try:
        cluster.up(timeout_ms)
    except BaseException:
        if not detach:
            cluster.down()
        raise
    live_console = err_console if as_json else console
    # From the first line printed: a Ctrl-C as soon as a user (or a script) sees the cluster is
    # up must stop it too, not end `up` with the cluster left running (seen once in a test).
    try:
        if as_json:
            print_json(cluster.status().to_json())
        else:
            for line in _summary(cluster.status()):
                typer.echo(line)
        if detach:
            return
        with live_console.status("", spinner="dots") as live:
            while True:
                live.update(_status_line(cluster.status()))
                time.sleep(STATUS_REFRESH_INTERVAL_S)
    except KeyboardInterrupt:
        if detach:
            raise  # --detach leaves the cluster running, as it would a moment later
        live_console.print("stopping the cluster ...", markup=False)
        cluster.down()
        live_console.print("stopped", markup=False)


@app.command("status")
@one_line_errors
def status(directory: DirOption = Path(DEFAULT_DIRECTORY), as_json: JsonOption = False) -> None:
    """Processes, ports and health of the local cluster (exit 1 when anything is unhealthy).

    Without --json, a last line says in words what is down and how to start it.

    Example: waltz dev status --dir .waltz-dev --json
    """
    report = LocalCluster.open(directory).status()
    if as_json:
        print_json(report.to_json())
    else:
        for line in _summary(report):
            typer.echo(line)
        verdict = _verdict(report, directory)
        if verdict is not None:
            typer.echo(verdict)
    if not report.healthy:
        raise typer.Exit(1)


@app.command("down")
@one_line_errors
def down(
    directory: DirOption = Path(DEFAULT_DIRECTORY),
    clean: Annotated[
        bool,
        typer.Option(
            "--clean", help="Also delete what `dev up` made there (data, logs, configs); nothing else."
        ),
    ] = False,
) -> None:
    """Stop servers, storage nodes and ZooKeeper (in that order); no cluster there is no error.

    Example: waltz dev down --dir .waltz-dev --clean
    """
    if not (directory / STATE_FILE_NAME).exists():
        # Nothing to stop is what a teardown script wants: exit 0, saying so.
        console.print(f"no dev cluster in {directory}: nothing to stop", markup=False)
        return
    LocalCluster.open(directory).down(clean)
    if not clean:
        console.print("stopped", markup=False)
    elif not directory.exists():
        console.print(f"stopped; removed {directory}", markup=False)
    else:
        kept = sorted(path.name for path in directory.iterdir())
        left = f" (kept what `dev up` did not make: {', '.join(kept)})" if kept else ""
        console.print(f"stopped; removed the cluster's files from {directory}{left}", markup=False)
