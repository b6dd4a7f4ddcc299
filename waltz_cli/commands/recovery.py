"""`waltz recover` and `waltz truncate`: partition repair commands (top-level; the lead registers them).

``recover`` opens a store session from this process (recovery runs now); ``truncate`` cuts a
replica's tail offline. Thin skins over :mod:`waltz_engine.ops.cluster_ops`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from waltz_cli.commands.cluster import say
from waltz_cli.commands.storage_admin import StoragePortOption, storage_node
from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    PartitionOption,
    SslConfigOption,
    StorageOption,
    cluster_command,
)
from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.ops import cluster_ops
from waltz_engine.ops.cluster_ops import RecoverResult
from waltz_engine.storage import admin_ops
from waltz_engine.zk.connection import connect

MS_PER_S = 1000


@one_line_errors
@cluster_command(default_timeout_ms=int(cluster_ops.DEFAULT_RECOVER_TIMEOUT_S * MS_PER_S))
def recover(
    partition: PartitionOption,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a partition's recovery now: open a new store session from this process.

    The session takes the partition's current generation from ZooKeeper and the next session
    id, which FENCES the owning server's session: that server opens a new session (and runs
    recovery again) on its next use of the partition. Prints the resolved high-water mark and
    each replica's state; a quorum of the partition's replicas must be reachable.

    Example: waltz recover -c tools.yml -p 0
    """
    settings = cluster.settings()
    ssl_context = admin_ops.client_ssl_context(ssl_config)
    with connect(settings) as client:
        result = asyncio.run(
            cluster_ops.recover_partition(
                client, settings.cluster_root, partition, ssl_context, timeout_s=cluster.timeout_ms / MS_PER_S
            )
        )
    if as_json:
        print_json(result.to_json())
        return
    _render_recovery(result)


def _cell(value: Any) -> Text:
    return Text("-" if value is None else str(value))


def _render_recovery(result: RecoverResult) -> None:
    say(
        f"partition {result.partition_id}: recovered in session {result.session_id} "
        f"(generation {result.generation}); high-water mark {result.high_water_mark}"
    )
    table = Table(title="replicas", title_justify="left")
    columns = ("storage", "state", "max transaction id", "lag")
    for column in columns:
        table.add_column(column)
    for replica in result.replicas:
        table.add_row(*(_cell(replica.get(key)) for key in ("storage", "state", "max_transaction_id", "lag")))
    console.print(table)


@one_line_errors
@cluster_command
def truncate(
    storage: StorageOption,
    partition: PartitionOption,
    to: Annotated[int, typer.Option("--to", help="Keep transactions up to this id (-1: keep none).")],
    storage_port: StoragePortOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Cut below the replica's low-water mark (committed data).")
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove a replica's transactions after --to, offline.

    The partition must be unavailable on that node (`waltz storage availability ... --offline`);
    cutting below the replica's low-water mark needs --force.

    Example: waltz truncate -c tools.yml -s localhost:55280 -p 0 --to 41
    """
    with storage_node(storage, cluster, ssl_config) as (
        context,
        node,
    ):
        data_port = node.data_port(storage_port)
        result = asyncio.run(
            cluster_ops.truncate_partition(context, node.admin, data_port, partition, to, force=force)
        )
    if as_json:
        print_json(result.to_json())
        return
    say(
        f"partition {result.partition_id} on {result.storage}: max transaction id "
        f"{result.old_max_transaction_id} -> {result.new_max_transaction_id} "
        f"({result.removed} transaction(s) removed)"
    )
