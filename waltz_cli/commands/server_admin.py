"""`waltz server list | add-preferred-partition | remove-preferred-partition | assign | unassign`.

The original's ``ServerCli`` (reference §4.3) plus forced assignment, which the original
lacked (its issue #6). A thin skin over :mod:`waltz_engine.ops.cluster_ops`; the lead adds these
to the `waltz server` group with :func:`register`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from waltz_cli.commands.cluster import say
from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    PartitionOption,
    PartitionsOption,
    cluster_command,
)
from waltz_cli.output import one_line_errors, print_json, usage_error
from waltz_engine.common.address import HostPort, parse_host_port
from waltz_engine.ops import cluster_ops
from waltz_engine.ops.cluster_ops import ForcedAssignment
from waltz_engine.ops.top import dev_cluster_http
from waltz_engine.zk.connection import connect
from waltz_engine.zk.partition_ranges import parse_partition_ranges

ServerOption = Annotated[
    str,
    typer.Option(
        "--server",
        help="The server: its client address HOST:PORT (server.port), or its id (see `waltz zk list`).",
    ),
]
TimeoutOption = Annotated[
    int,
    typer.Option(
        "--timeout-ms", min=1, help="Give up on a server that does not connect or answer in this long."
    ),
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
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            help="The server's HTTP address HOST:PORT (server.jetty.port); default: every server of "
            "the local dev cluster.",
        ),
    ] = None,
    timeout_ms: TimeoutOption = cluster_ops.DEFAULT_TIMEOUT_MS,
    as_json: JsonOption = False,
) -> None:
    """List Waltz server partition information (its partitions and their storage nodes, from /metrics).

    With --json and no --http: one document per server of the dev cluster (JSON lines).

    Example: waltz server list

    Example: waltz server list --http localhost:55282
    """
    addresses = [http] if http is not None else list(dev_cluster_http(None, ("servers",)))
    if not addresses:
        usage_error("which server? give --http HOST:PORT (its server.jetty.port); no dev cluster here")
    for address in addresses:
        found = cluster_ops.server_list(parse_host_port(address, "Http"), timeout_ms)
        if as_json:
            print_json(found.to_json())
            continue
        for line in found.lines():
            say(line)


def _server_endpoint(server: str, cluster: Cluster) -> HostPort:
    """``--server``: HOST:PORT as given, or a live server's id looked up in ZooKeeper."""
    if server.strip().isdigit():
        settings = cluster.settings()
        with connect(settings) as client:
            return cluster_ops.server_endpoint(client, settings.cluster_root, int(server))
    return parse_host_port(server, "Server", "host:server_port (or a server id)")


def _preferred(
    add: bool,
    server: str,
    partition: str,
    cluster: Cluster,
    as_json: bool,
) -> None:
    ids = parse_partition_ranges(partition)
    endpoint = _server_endpoint(server, cluster)
    change = cluster_ops.add_preferred_partitions if add else cluster_ops.remove_preferred_partitions
    asyncio.run(change(endpoint, ids, cluster.tls_context(), cluster.timeout_ms))
    if as_json:
        print_json({"server": str(endpoint), "partitions": ids, "preferred": add})
    else:
        verb = "added preferred partition(s) {} to" if add else "removed preferred partition(s) {} from"
        say(f"{verb.format(cluster_ops.java_list(ids))} server {endpoint}")


@one_line_errors
@cluster_command
def add_preferred_partition(
    server: ServerOption,
    partition: PartitionsOption,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Add a preferred partition or multiple partitions to the server (it takes them over).

    ZooKeeper (-c/-z/-r) is asked only to find a server given by id; --config's ssl.* keys
    secure the connection to the server.

    Example: waltz server add-preferred-partition --server localhost:55280 -p 0-3
    """
    _preferred(True, server, partition, cluster, as_json)


@one_line_errors
@cluster_command
def remove_preferred_partition(
    server: ServerOption,
    partition: PartitionsOption,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Remove a preferred partition or multiple partitions from the server.

    ZooKeeper (-c/-z/-r) is asked only to find a server given by id.

    Example: waltz server remove-preferred-partition --server localhost:55280 -p 0-3
    """
    _preferred(False, server, partition, cluster, as_json)


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
@cluster_command
def assign(
    partition: PartitionOption,
    server: Annotated[int, typer.Option("--server", help="Id of a live server (see `waltz zk list`).")],
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Force a partition onto a server (kept there while the server lives, until unassign).

    The coordinator moves the partition at once, with a new generation.

    Example: waltz server assign -c tools.yml --partition 3 --server 2
    """
    settings = cluster.settings()
    with connect(settings) as client:
        result = cluster_ops.assign_partition(client, settings.cluster_root, partition, server)
    _show(result, as_json)


@one_line_errors
@cluster_command
def unassign(
    partition: PartitionOption,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Hand a forced partition back to the assignment policy.

    Example: waltz server unassign -c tools.yml --partition 3
    """
    settings = cluster.settings()
    with connect(settings) as client:
        result = cluster_ops.unassign_partition(client, settings.cluster_root, partition)
    _show(result, as_json)
