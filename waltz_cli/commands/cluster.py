"""`waltz cluster check-connectivity | verify`: the original's ``ClusterCli`` (reference §4.5).

A thin skin over :mod:`waltz_engine.ops.cluster_ops`: read the cluster from ZooKeeper once, ask
servers and storage nodes, render. TLS keys for those connections are read under ``ssl.``
in the ``--config`` YAML, as the original's tools do.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

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
from waltz_engine.ops import cluster_ops
from waltz_engine.ops.cluster_ops import ClusterView, VerifyReport
from waltz_engine.zk.connection import connect

app = options.group(help="Check and verify a whole cluster (servers, storage nodes, ZooKeeper).")

MS_PER_S = 1000
PASSED = "Passed"
FAILED = "Failed"
EXIT_VERIFY_FAILED = 1


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
    if as_json:
        print_json(report.to_json())
    else:
        _render(report)
    if not report.passed:
        raise typer.Exit(EXIT_VERIFY_FAILED)


def _render(report: VerifyReport) -> None:
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
    say(PASSED if report.passed else FAILED)
