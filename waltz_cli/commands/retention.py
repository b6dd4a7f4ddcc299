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
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    PartitionOption,
    SslConfigOption,
    cluster_command,
)
from waltz_cli.output import console, fail, one_line_errors, print_json
from waltz_engine.ops.retention_report import (
    ReplicaRemovals,
    RetentionReport,
    read_retentions,
    replica_removals,
    replica_starts,
)
from waltz_engine.storage import admin_ops
from waltz_engine.storage.network_reader import ClusterAccess, committed_high_water_marks
from waltz_engine.zk import retention
from waltz_engine.zk.connection import connect
from waltz_engine.zk.partition_ranges import not_in_cluster
from waltz_engine.zk.retention import effective_bound, read_highest_bounds

app = options.group(help="Log retention: which records the storage nodes may remove.")

DEFAULT_TIMEOUT_MS = 10_000
NONE_TEXT = "-"


def say(message: str) -> None:
    """One line, never wrapped or read as markup (paths)."""
    console.print(message, soft_wrap=True, markup=False, highlight=False)


def _check_partition(partition: int, num_partitions: int) -> None:
    if not 0 <= partition < num_partitions:
        fail(not_in_cluster([partition], num_partitions))


@app.command("set")
@one_line_errors
@cluster_command
def set_(
    partition: PartitionOption,
    before: Annotated[int, typer.Option("--before", help="Records below this txid may be removed.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", "-f", help="Set a bound above the committed high-water mark + 1 (not checked then)."
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Change nothing; list, per replica, the segments the bound would let its cleaner "
            "remove (asked of the storage nodes of the cluster named, over the network).",
        ),
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
) -> None:
    """Let the storage nodes remove records of a partition below --before (unexported ones stay).

    A bound above the partition's committed high-water mark + 1 is refused without --force: it
    would let records go as soon as they are written.

    --dry-run reads the cluster -c/-z (or the environment) names, from its storage nodes' admin
    ports: a Java node lists no segment spans, and its segments are reported as unknown.

    Example: waltz retention set -p 0 --before 100000 --dry-run

    Example: waltz retention set -z 127.0.0.1:2181 -r /waltz --partition 0 --before 100000
    """
    if before < 0:
        fail(f"--before must not be negative, got {before}")
    settings = cluster.settings()
    with connect(settings) as client:
        layout = admin_ops.read_store_layout(client, settings.cluster_root)
        _check_partition(partition, layout.num_partitions)
        watermarks = read_retentions(client, settings.cluster_root, layout)[partition].watermarks
        if not force:
            access = ClusterAccess(settings, cluster.tls_config())
            mark = committed_high_water_marks(access, [partition])[partition]
            if before > mark + 1:
                fail(
                    f"--before {before} is above partition {partition}'s committed high-water mark {mark}: "
                    f"records {mark + 1}..{before - 1} would go as soon as they are written "
                    f"(give --before {mark + 1} at most, or --force)"
                )
        if not dry_run:
            highest = retention.set_retention_bound(client, settings.cluster_root, partition, before)
            console.print(f"partition {partition}: records below {before} may be removed")
            if highest > before:
                console.print(
                    f"partition {partition}: a bound of {highest} was set before: records below it "
                    "may be gone already (a lower bound keeps what is still there, it brings nothing back)"
                )
            return
    limit = effective_bound(before, list(watermarks.values())) or 0
    tls = cluster.tls_context(ssl_config)
    _dry_run(
        partition,
        limit,
        before,
        asyncio.run(replica_removals(layout, tls, cluster.timeout_ms, partition, limit)),
    )


def _dry_run(partition: int, limit: int, before: int, replicas: list[ReplicaRemovals]) -> None:
    kept = f" (exports keep what they have not read: below {limit} only)" if limit < before else ""
    say(f"dry run, nothing changed: partition {partition}: records below {before} could be removed{kept}")
    if not replicas:
        say(f"partition {partition} has no replica assigned in ZooKeeper")
    for replica in replicas:
        if replica.going is None:
            say(f"{replica.storage}: segments that may go: unknown ({replica.why})")
            continue
        listed = ", ".join(f"{first}..{last}" for first, last in replica.going) or "none"
        more = " and later ones (the node lists only its oldest segments)" if replica.more else ""
        say(f"{replica.storage}: segments that may go now: {listed}{more}")


@app.command("clear")
@one_line_errors
@cluster_command
def clear(
    partition: PartitionOption,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Remove the bound of a partition: nothing more is removed (removed records do not come back).

    Example: waltz retention clear -z 127.0.0.1:2181 -r /waltz --partition 0
    """
    settings = cluster.settings()
    with connect(settings) as client:
        existed = retention.clear_retention_bound(client, settings.cluster_root, partition)
    console.print(f"partition {partition}: " + ("bound cleared" if existed else "had no bound"))


@app.command("show")
@one_line_errors
@cluster_command
def show(
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per partition: the bound, export watermarks, the effective bound and each replica's first txid.

    Example: waltz retention show -z 127.0.0.1:2181 -r /waltz
    """
    settings = cluster.settings()
    with connect(settings) as client:
        layout = admin_ops.read_store_layout(client, settings.cluster_root)
        partitions = read_retentions(client, settings.cluster_root, layout)
        highest = read_highest_bounds(client, settings.cluster_root)
    replicas = asyncio.run(replica_starts(layout, cluster.tls_context(ssl_config), cluster.timeout_ms))
    report = RetentionReport(partitions, replicas, highest)
    if as_json:
        print_json(report.to_json())
        return
    table = Table("partition", "bound", "highest set", "exports", "effective", "replica first txids")
    for r in report.partitions:
        exports = ", ".join(f"{e}={w}" for e, w in sorted(r.watermarks.items())) or NONE_TEXT
        starts = ", ".join(
            f"{s.storage}={s.first_transaction_id if s.first_transaction_id is not None else '?'}"
            for s in report.replicas.get(r.partition_id, [])
        )
        table.add_row(
            str(r.partition_id),
            NONE_TEXT if r.bound is None else str(r.bound),
            str(report.highest.get(r.partition_id, NONE_TEXT)),
            exports,
            NONE_TEXT if r.effective_bound is None else str(r.effective_bound),
            starts or NONE_TEXT,
        )
    console.print(table)
