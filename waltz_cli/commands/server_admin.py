"""`waltz server list | add-preferred-partition | remove-preferred-partition | assign | unassign`.

The original's ``ServerCli`` (reference §4.3) plus forced assignment, which the original
lacked (its issue #6). A thin skin over :mod:`waltz_engine.cluster_ops`; the lead adds these
to the `waltz server` group with :func:`register`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from waltz_cli.commands.cluster import say
from waltz_cli.commands.zk import ConfigOption, ConnectTimeoutOption, JsonOption, RootOption, ZooKeeperOption
from waltz_cli.output import one_line_errors, print_json
from waltz_engine import cluster_ops
from waltz_engine.address import parse_host_port
from waltz_engine.cluster_ops import ForcedAssignment
from waltz_engine.zk.connection import connect, load_settings
from waltz_engine.zk.partition_ranges import parse_partition_ranges

ServerPortOption = Annotated[
    str, typer.Option("--server", "-s", help="The server's client port, host:server_port.")
]
PartitionsOption = Annotated[
    str, typer.Option("--partition", "-p", help="Partition ids and ranges, e.g. 0-6,7,10-16.")
]
PartitionOption = Annotated[int, typer.Option("--partition", "-p", help="One partition id.")]
TimeoutOption = Annotated[
    int,
    typer.Option("--timeout-ms", help="Give up on a server that does not connect or answer in this long."),
]


def register(app: typer.Typer) -> None:
    """Add the operator commands to the `waltz server` group."""
    for name, command in (
        ("list", list_),
        ("add-preferred-partition", add_preferred_partition),
        ("remove-preferred-partition", remove_preferred_partition),
        ("assign", assign),
        ("unassign", unassign),
    ):
        app.command(name)(command)


@one_line_errors
def list_(
    server: Annotated[str, typer.Option("--server", "-s", help="The server's HTTP port, host:jetty_port.")],
    timeout_ms: TimeoutOption = cluster_ops.DEFAULT_TIMEOUT_MS,
    as_json: JsonOption = False,
) -> None:
    """List Waltz server partition information (its partitions and their storage nodes, from /metrics).

    Example: waltz server list -s localhost:55281
    """
    found = cluster_ops.server_list(parse_host_port(server, "Http"), timeout_ms)
    if as_json:
        print_json(found.to_json())
        return
    for line in found.lines():
        say(line)


def _preferred(
    add: bool, server: str, partition: str, config: Path | None, timeout_ms: int, as_json: bool
) -> None:
    endpoint = parse_host_port(server, "Server", "host:server_port")
    ids = parse_partition_ranges(partition)
    ssl_context = cluster_ops.tools_ssl_context(config)
    change = cluster_ops.add_preferred_partitions if add else cluster_ops.remove_preferred_partitions
    asyncio.run(change(endpoint, ids, ssl_context, timeout_ms))
    if as_json:
        print_json({"server": str(endpoint), "partitions": ids, "preferred": add})
    else:
        verb = "added preferred partition(s) {} to" if add else "removed preferred partition(s) {} from"
        say(f"{verb.format(cluster_ops.java_list(ids))} server {endpoint}")


@one_line_errors
def add_preferred_partition(
    server: ServerPortOption,
    partition: PartitionsOption,
    config: ConfigOption = None,
    timeout_ms: TimeoutOption = cluster_ops.DEFAULT_TIMEOUT_MS,
    as_json: JsonOption = False,
) -> None:
    """Add a preferred partition or multiple partitions to the server (it takes them over;
    --config is read only for its ssl.* keys).

    Example: waltz server add-preferred-partition -s localhost:55280 -p 0-3
    """
    _preferred(True, server, partition, config, timeout_ms, as_json)


@one_line_errors
def remove_preferred_partition(
    server: ServerPortOption,
    partition: PartitionsOption,
    config: ConfigOption = None,
    timeout_ms: TimeoutOption = cluster_ops.DEFAULT_TIMEOUT_MS,
    as_json: JsonOption = False,
) -> None:
    """Remove a preferred partition or multiple partitions from the server.

    Example: waltz server remove-preferred-partition -s localhost:55280 -p 0-3
    """
    _preferred(False, server, partition, config, timeout_ms, as_json)


def _show(result: ForcedAssignment, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
    elif result.server_id is not None:
        state = "forced" if result.changed else "already forced"
        say(f"partition {result.partition_id} {state} to server {result.server_id} ({result.endpoint})")
    elif result.changed:
        say(f"partition {result.partition_id} handed back to the assignment policy")
    else:
        say(f"partition {result.partition_id} was not forced to any server; nothing changed")


@one_line_errors
def assign(
    partition: PartitionOption,
    server: Annotated[int, typer.Option("--server", help="Id of a live server (see `waltz zk list`).")],
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    config: ConfigOption = None,
    connect_timeout_ms: ConnectTimeoutOption = None,
    as_json: JsonOption = False,
) -> None:
    """Force a partition onto a server (kept there while the server lives, until unassign).

    The coordinator moves the partition at once, with a new generation.

    Example: waltz server assign -c tools.yml --partition 3 --server 2
    """
    settings = load_settings(config, zookeeper, cluster_root, connect_timeout_ms)
    with connect(settings) as client:
        result = cluster_ops.assign_partition(client, settings.cluster_root, partition, server)
    _show(result, as_json)


@one_line_errors
def unassign(
    partition: PartitionOption,
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    config: ConfigOption = None,
    connect_timeout_ms: ConnectTimeoutOption = None,
    as_json: JsonOption = False,
) -> None:
    """Hand a forced partition back to the assignment policy.

    Example: waltz server unassign -c tools.yml --partition 3
    """
    settings = load_settings(config, zookeeper, cluster_root, connect_timeout_ms)
    with connect(settings) as client:
        result = cluster_ops.unassign_partition(client, settings.cluster_root, partition)
    _show(result, as_json)
