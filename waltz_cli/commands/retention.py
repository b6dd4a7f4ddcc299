"""`waltz retention ...`: mark what the storage nodes may remove (our extension; reference
Waltz never deletes). A thin skin over :mod:`waltz_engine.zk.retention`: the bounds live in
ZooKeeper, and each storage node's cleaner removes whole segments below the effective bound
(the bound, lowered to every export's watermark + 1) in the background.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from waltz_cli import options
from waltz_cli.options import (
    ConfigOption,
    ConnectTimeoutOption,
    JsonOption,
    PartitionOption,
    RootOption,
    SslConfigOption,
    ZooKeeperOption,
)
from waltz_cli.output import console, fail, one_line_errors, print_json
from waltz_engine.ops.retention_report import RetentionReport, read_retentions, replica_starts
from waltz_engine.ops.tool_config import load_settings
from waltz_engine.storage import admin_ops
from waltz_engine.zk import retention
from waltz_engine.zk.connection import connect
from waltz_engine.zk.partition_ranges import not_in_cluster

app = options.group(help="Log retention: which records the storage nodes may remove.")

DEFAULT_TIMEOUT_MS = 10_000
NONE_TEXT = "-"


def _check_partition(partition: int, num_partitions: int) -> None:
    if not 0 <= partition < num_partitions:
        fail(not_in_cluster([partition], num_partitions))


@app.command("set")
@one_line_errors
def set_(
    partition: PartitionOption,
    before: Annotated[int, typer.Option("--before", help="Records below this txid may be removed.")],
    config: ConfigOption = None,
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    connect_timeout_ms: ConnectTimeoutOption = None,
) -> None:
    """Let the storage nodes remove records of a partition below --before (unexported ones stay).

    Example: waltz retention set -z 127.0.0.1:2181 -r /waltz --partition 0 --before 100000
    """
    if before < 0:
        fail(f"--before must not be negative, got {before}")
    settings = load_settings(config, zookeeper, cluster_root, connect_timeout_ms)
    with connect(settings) as client:
        _check_partition(partition, admin_ops.read_store_layout(client, settings.cluster_root).num_partitions)
        retention.set_retention_bound(client, settings.cluster_root, partition, before)
    console.print(f"partition {partition}: records below {before} may be removed")


@app.command("clear")
@one_line_errors
def clear(
    partition: PartitionOption,
    config: ConfigOption = None,
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    connect_timeout_ms: ConnectTimeoutOption = None,
) -> None:
    """Remove the bound of a partition: nothing more is removed (removed records do not come back).

    Example: waltz retention clear -z 127.0.0.1:2181 -r /waltz --partition 0
    """
    settings = load_settings(config, zookeeper, cluster_root, connect_timeout_ms)
    with connect(settings) as client:
        existed = retention.clear_retention_bound(client, settings.cluster_root, partition)
    console.print(f"partition {partition}: " + ("bound cleared" if existed else "had no bound"))


@app.command("show")
@one_line_errors
def show(
    config: ConfigOption = None,
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    connect_timeout_ms: ConnectTimeoutOption = None,
    ssl_config: SslConfigOption = None,
    timeout_ms: Annotated[
        int,
        typer.Option(
            "--timeout-ms", min=1, help="Give up on a storage node that does not answer in this long."
        ),
    ] = DEFAULT_TIMEOUT_MS,
    as_json: JsonOption = False,
) -> None:
    """Per partition: the bound, export watermarks, the effective bound and each replica's first txid.

    Example: waltz retention show -z 127.0.0.1:2181 -r /waltz
    """
    settings = load_settings(config, zookeeper, cluster_root, connect_timeout_ms)
    with connect(settings) as client:
        layout = admin_ops.read_store_layout(client, settings.cluster_root)
        partitions = read_retentions(client, settings.cluster_root, layout)
    replicas = asyncio.run(replica_starts(layout, admin_ops.client_ssl_context(ssl_config), timeout_ms))
    report = RetentionReport(partitions, replicas)
    if as_json:
        print_json(report.to_json())
        return
    table = Table("partition", "bound", "exports", "effective", "replica first txids")
    for r in report.partitions:
        exports = ", ".join(f"{e}={w}" for e, w in sorted(r.watermarks.items())) or NONE_TEXT
        starts = ", ".join(
            f"{s.storage}={s.first_transaction_id if s.first_transaction_id is not None else '?'}"
            for s in report.replicas.get(r.partition_id, [])
        )
        table.add_row(
            str(r.partition_id),
            NONE_TEXT if r.bound is None else str(r.bound),
            exports,
            NONE_TEXT if r.effective_bound is None else str(r.effective_bound),
            starts or NONE_TEXT,
        )
    console.print(table)
