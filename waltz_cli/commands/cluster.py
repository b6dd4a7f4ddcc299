"""`waltz cluster check-connectivity | verify`: the original's ``ClusterCli`` (reference §4.5).

A thin skin over :mod:`waltz_engine.ops.cluster_ops`: read the cluster from ZooKeeper once, ask
servers and storage nodes, render. TLS keys for those connections are read under ``ssl.``
in the ``--config`` YAML, as the original's tools do.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from waltz_cli import options
from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    cluster_command,
)
from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.common.errors import WaltzError
from waltz_engine.ops import cluster_ops
from waltz_engine.ops.cluster_ops import ClusterView, VerifyReport
from waltz_engine.zk.connection import connect

if TYPE_CHECKING:
    from waltz_engine.ops.cluster_ops.replication import ReplicationReport

app = options.group(help="Check and verify a whole cluster (servers, storage nodes, ZooKeeper).")

MS_PER_S = 1000
PASSED = "Passed"
FAILED = "Failed"
EXIT_VERIFY_FAILED = 1
EXIT_UNDER_REPLICATED = 1  # `under-replicated` found some: monitoring alerts on the exit code
DETAIL_MAX_CHARS = 60  # the under-replicated table's detail cell (--json has the whole text)


def read_view(cluster: Cluster) -> ClusterView:
    settings = cluster.settings()
    with connect(settings) as client:
        return cluster_ops.read_cluster_view(client, settings.cluster_root)


def say(message: str) -> None:
    """One line, never wrapped; host names are never read as markup."""
    console.print(message, soft_wrap=True, markup=False, highlight=False)


@app.command("check-connectivity")
@one_line_errors
@cluster_command
def check_connectivity(
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Checks the connectivity of the cluster: each live server (from ZooKeeper) is asked to open
    every storage node; a server that does not answer is UNREACHABLE.

    Example: waltz cluster check-connectivity -c tools.yml
    """
    view = read_view(cluster)
    ssl_context = cluster_ops.tools_ssl_context(cluster.config)
    statuses = asyncio.run(cluster_ops.check_connectivity(view, ssl_context, cluster.timeout_ms))
    if as_json:
        print_json({"servers": [s.to_json() for s in statuses]})
        return
    if not statuses:
        say("no live servers registered in ZooKeeper")
    for status in statuses:
        say(status.line())


@app.command("verify")
@one_line_errors
@cluster_command(default_timeout_ms=cluster_ops.DEFAULT_VERIFY_TIMEOUT_S * MS_PER_S)
def verify(
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", help="Only this partition (default: every partition)."),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Validates if partition(s) is handled by some server: the original's seven validations
    per partition (ZooKeeper assignment, server agreement, server-storage connectivity, storage
    assignment, quorum, replica recovery, partition health). Exits 0 only when all pass.

    Example: waltz cluster verify -c tools.yml -p 3 --timeout-ms 10000
    """
    view = read_view(cluster)
    cluster_ops.check_verify_partition(view, partition)
    ssl_context = cluster_ops.tools_ssl_context(cluster.config)
    report = asyncio.run(cluster_ops.verify(view, ssl_context, cluster.timeout_ms / MS_PER_S))
    if partition is not None:
        report = report._replace(partitions=(report.partitions[partition],))
    short = _under_replicated_count(cluster, view, None if partition is None else [partition])
    if as_json:
        print_json({**report.to_json(), "under_replicated_count": short})
    else:
        _render(report, short)
    if not report.passed:
        raise typer.Exit(EXIT_VERIFY_FAILED)


@app.command("under-replicated")
@one_line_errors
@cluster_command
def under_replicated(
    partitions: Annotated[
        str | None,
        typer.Option("--partition", "-p", help="Partition ids and ranges (default: every partition)."),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Partitions whose caught-up, reachable replicas are fewer than their assigned count, with
    each missing replica and why (down, behind by N, offline, unassigned on the node, damaged).
    Exits 1 when any partition is under-replicated, 0 when none is (for monitoring scripts).

    Example: waltz cluster under-replicated -c tools.yml --json
    """
    from waltz_engine.storage.network_reader import check_partition_ids
    from waltz_engine.zk.partition_ranges import parse_partition_ranges

    view = read_view(cluster)
    wanted = (
        None
        if partitions is None
        else check_partition_ids(parse_partition_ranges(partitions), view.num_partitions)
    )
    report = _replication(cluster, view, wanted)
    if as_json:
        print_json(report.to_json())
        if report.under_replicated:
            raise typer.Exit(EXIT_UNDER_REPLICATED)
        return
    if not report.under_replicated:
        say(f"no partition is under-replicated ({len(report.partitions)} checked)")
        return
    table = Table(title="under-replicated partitions", title_justify="left")
    for column in ("partition", "caught up", "replica", "state", "detail"):
        table.add_column(column)
    for partition in report.under_replicated:
        for replica in partition.replicas:
            if not replica.caught_up:
                caught_up = f"{partition.caught_up} of {len(partition.replicas)}"
                cells = (
                    str(partition.partition_id),
                    caught_up,
                    replica.storage,
                    replica.state,
                    _short(replica.detail),
                )
                table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    raise typer.Exit(EXIT_UNDER_REPLICATED)


def _short(detail: str) -> str:
    """A table cell of at most DETAIL_MAX_CHARS characters (--json has the whole text)."""
    first_line = detail.split("\n", 1)[0]
    if len(first_line) > DETAIL_MAX_CHARS:
        return first_line[: DETAIL_MAX_CHARS - 1] + "…"
    return first_line if first_line == detail else first_line + "…"


def _render(report: VerifyReport, under_replicated: int | None) -> None:
    """A pass/fail table, then each failure as the original prints it (unwrapped, for grep)."""
    table = Table(title="cluster verification", title_justify="left")
    for column in ("partition", "validation", "result"):
        table.add_column(column)
    for partition in report.partitions:
        for result in partition.results:
            outcome = Text("pass", style="green") if result.passed else Text("FAIL", style="bold red")
            table.add_row(str(partition.partition_id), result.type.value, outcome)
    console.print(table)
    for line in report.original_text():
        say(line)
    for storage, reason in sorted(report.unreachable_storages.items()):
        say(f"storage node {storage} did not answer: {reason}")
    # Ours, before the original's last line (Passed/Failed), which scripts read.
    counted = under_replicated if under_replicated is not None else "unknown (no server answers for each)"
    say(f"under-replicated partitions: {counted} (`waltz cluster under-replicated` names them)")
    say(PASSED if report.passed else FAILED)


def _replication(cluster: Cluster, view: ClusterView, wanted: list[int] | None) -> ReplicationReport:
    from waltz_engine.ops.cluster_ops.replication import replication_report
    from waltz_engine.storage.network_reader import ClusterAccess

    context = view.storage_context(cluster.tls_context(), cluster.timeout_ms)
    access = ClusterAccess(cluster.settings(), cluster.tls_config())
    return asyncio.run(replication_report(view, context, access, wanted))


def _under_replicated_count(cluster: Cluster, view: ClusterView, wanted: list[int] | None) -> int | None:
    """None when it cannot be known: the count needs each partition's committed high-water mark,
    which only a live server assigned the partition gives (verify itself runs without one)."""
    live = {s.server_id for s in view.servers}
    served = {p for s in live for p in view.partitions_of(s)}
    if not set(range(view.num_partitions) if wanted is None else wanted) <= served:
        return None
    try:
        return len(_replication(cluster, view, wanted).under_replicated)
    except WaltzError:
        return None
