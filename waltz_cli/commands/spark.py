"""`waltz spark`: Spark jobs over the log; a thin skin over :mod:`spark.export` / :mod:`spark.submit`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from waltz_cli import options
from waltz_cli.options import ENV_CONFIG, JsonOption, RootOption, ZooKeeperOption
from waltz_cli.output import console, err_console, fail, one_line_errors, print_json
from waltz_engine.common.config import Config
from waltz_engine.ops.tool_config import load_tool_config
from waltz_engine.zk.connection import KEY_CLUSTER_ROOT, KEY_CONNECT_STRING

app = options.group(help="Spark jobs over a Waltz log (export to Parquet).")

# ZooKeeper is optional here (it finds the committed marks, and keeps an incremental export's
# watermarks), so unlike other commands the export does not fall back to a local dev cluster.
ExportConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar=ENV_CONFIG,
        help="Client YAML with zookeeper.connectString and cluster.root (default: none; without "
        "ZooKeeper the control files' low-water marks bound the export).",
    ),
]

MISSING = "-"


def _read_options(
    directories: list[Path] | None,
    zookeeper: str | None,
    cluster_root: str | None,
    config: Path | None,
    partitions: str | None,
    on_corrupt: str,
) -> dict[str, str]:
    from spark.plan import (
        OPTION_CLUSTER_ROOT,
        OPTION_ON_CORRUPT,
        OPTION_PARTITIONS,
        OPTION_PATHS,
        OPTION_ZOOKEEPER,
    )

    if config is not None:
        loaded = load_tool_config(config) or Config({}, str(config))
        zookeeper = zookeeper or loaded.optional_str(KEY_CONNECT_STRING)
        cluster_root = cluster_root or loaded.optional_str(KEY_CLUSTER_ROOT)
    options = {
        OPTION_PATHS: ",".join(str(d.resolve()) for d in directories or []),
        OPTION_ON_CORRUPT: on_corrupt,
    }
    if zookeeper:
        options[OPTION_ZOOKEEPER] = zookeeper
    if cluster_root:
        options[OPTION_CLUSTER_ROOT] = cluster_root
    if partitions:
        options[OPTION_PARTITIONS] = partitions
    return options


def _summary_table(summary: object) -> Table:
    from spark.export import ExportSummary

    assert isinstance(summary, ExportSummary)
    table = Table(title=f"export {summary.export_id} -> {summary.output}")
    for column in ("partition", "from txid", "to txid", "rows", "watermark", "missing (retention)"):
        table.add_column(column, justify="right")
    for p in summary.partitions:
        table.add_row(
            str(p.partition),
            str(p.from_txid),
            str(p.to_txid),
            str(p.rows),
            str(p.watermark),
            p.missing or MISSING,
        )
    table.caption = (
        f"{summary.rows} rows in {summary.files} files, {summary.seconds:.1f} s "
        f"({summary.rows_per_s:,.0f} rows/s)"
        + ("; finished a killed run first" if summary.recovered_previous_run else "")
        + ("; watermarks published to ZooKeeper" if summary.published_to_zookeeper else "")
    )
    return table


@app.command("export")
@one_line_errors
def export(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Directory of the export (hive-style partition=N/).")
    ],
    directories: Annotated[
        list[Path] | None,
        typer.Argument(help="Storage directories to read (local files).", show_default=False),
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="Output format.")] = "parquet",
    partitions: Annotated[
        str | None,
        typer.Option("--partition", "-p", help="Partition ids and ranges, e.g. 0,2-3 (default all)."),
    ] = None,
    decoder: Annotated[
        str | None, typer.Option("--decoder", help="module:function; adds a 'decoded' text column.")
    ] = None,
    master: Annotated[
        str, typer.Option("--master", "-m", help="local[*], or spark://HOST:PORT to spark-submit the job.")
    ] = "local[*]",
    incremental: Annotated[
        bool, typer.Option("--incremental", help="Add only what is new since the output's watermarks.")
    ] = False,
    export_id: Annotated[
        str | None,
        typer.Option("--export-id", help="Name of the watermarks in ZooKeeper (default: output's name)."),
    ] = None,
    config: ExportConfigOption = None,
    zookeeper: ZooKeeperOption = None,
    cluster_root: RootOption = None,
    on_corrupt: Annotated[
        str, typer.Option("--on-corrupt", help="fail or skip records failing checksums.")
    ] = "fail",
    old_partitions: Annotated[
        # The spelling before -p/--partition (ids and ranges, as everywhere else).
        str | None,
        typer.Option("--partitions", hidden=True),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export the committed log to Parquet, all of it or (--incremental) only what is new.

    Example: waltz spark export -o /data/export -c client.yml -p 0-3 --incremental STORAGE_DIR...
    """
    from spark.export import LOCAL_MASTER_PREFIX, ExportConfig, check_config, run_export, spark_session
    from spark.submit import submit_export

    if old_partitions is not None:
        if partitions is not None:
            fail("give --partition (or its old spelling --partitions), not both")
        partitions = old_partitions

    export_config = ExportConfig(
        output=output.resolve(),
        read_options=_read_options(directories, zookeeper, cluster_root, config, partitions, on_corrupt),
        format=output_format,
        decoder=decoder,
        incremental=incremental,
        export_id=export_id,
    )
    check_config(export_config)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=as_json,
    ) as progress:
        if master.startswith(LOCAL_MASTER_PREFIX):
            task = progress.add_task("starting Spark", total=None)
            session = spark_session(master, quiet=True)
            progress.update(task, description="exporting (tasks)")
            try:
                summary = run_export(
                    session,
                    export_config,
                    lambda done, total: progress.update(task, completed=done, total=total),
                )
            finally:
                session.stop()
        else:
            progress.add_task(f"running on {master}", total=None)
            summary = submit_export(export_config, master)
    if as_json:
        print_json(summary.to_json())
    else:
        console.print(_summary_table(summary))
