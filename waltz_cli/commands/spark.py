"""`waltz spark`: Spark jobs over the log; a thin skin over :mod:`spark.export` / :mod:`spark.submit`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.filesize import decimal
from rich.progress import Progress, ProgressColumn, Task, TaskID
from rich.table import Table
from rich.text import Text

from waltz_cli import options
from waltz_cli.options import ENV_CONFIG, JsonOption, RootOption, ZooKeeperOption
from waltz_cli.output import console, fail, one_line_errors, print_json, progress_bar
from waltz_engine.common.config import Config, resolve_config_path
from waltz_engine.ops.tool_config import load_tool_config
from waltz_engine.zk.connection import KEY_CLUSTER_ROOT, KEY_CONNECT_STRING

if TYPE_CHECKING:
    from spark.export import ExportConfig, ExportSummary
    from spark.progress import ExportProgress

MAX_ERROR_CHAIN = 16  # how far back an error's causes are searched for the Ctrl-C

app = options.group(help="Spark jobs over a Waltz log (export to Parquet).")

# Without -c/-z the export reads the local dev cluster, as every command does, unless it is given
# storage directories: those alone are a valid (offline) source.
ExportConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar=ENV_CONFIG,
        help="Client YAML: zookeeper.connectString, cluster.root and the TLS keys (ssl.*) to reach "
        "the storage nodes; default (without storage directories): the local dev cluster's.",
    ),
]
# Exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT = 130

MISSING = "-"
# Fields of a progress line (rich task fields) that only the export's lines have.
FIELD_BYTES = "bytes"
FIELD_ROWS = "rows"


class _BytesColumn(ProgressColumn):
    """The bytes a line has exported so far (blank on lines that count no bytes)."""

    def render(self, task: Task) -> Text:
        size = task.fields.get(FIELD_BYTES)
        return Text("" if size is None else decimal(size))


class _RowsPerSecondColumn(ProgressColumn):
    """The line's rows/s since it started. An average, not rich's recent-window speed: the counts
    move a whole Spark task at a time, too coarse for a rate over the last few updates."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed
        if not task.fields.get(FIELD_ROWS) or not elapsed or not task.completed:
            return Text("")
        return Text(f"{task.completed / elapsed:,.0f} rows/s")


class ExportBars:
    """An export's progress lines: the whole job (rows, Spark tasks), then one per partition
    (rows done of the rows to do, bytes, rows/s)."""

    def __init__(self, progress: Progress, job: TaskID) -> None:
        self.progress = progress
        self._job = job
        self._partitions: dict[int, TaskID] = {}

    def update(self, state: ExportProgress) -> None:
        tasks = f" ({state.tasks_done}/{state.tasks_total} tasks)" if state.tasks_total else ""
        if not self._partitions:  # the job starts: its rate counts from here, not from Spark's start
            self.progress.reset(self._job)
        self.progress.update(
            self._job,
            description=f"exporting{tasks}",
            completed=state.rows,
            total=state.rows_total,
            bytes=sum(p.bytes for p in state.partitions),
            rows=True,
        )
        for part in state.partitions:
            if part.partition not in self._partitions:
                self._partitions[part.partition] = self.progress.add_task(
                    f"  partition {part.partition}", total=part.rows_total, rows=True
                )
            self.progress.update(self._partitions[part.partition], completed=part.rows, bytes=part.bytes)


def _read_options(
    directories: list[Path] | None,
    zookeeper: str | None,
    cluster_root: str | None,
    config: Path | None,
    partitions: str | None,
    on_corrupt: str,
    to_txid: int | None = None,
    tier_url: str | None = None,
) -> dict[str, str]:
    from spark.plan import (
        OPTION_CLUSTER_ROOT,
        OPTION_CONFIG,
        OPTION_ON_CORRUPT,
        OPTION_PARTITIONS,
        OPTION_PATHS,
        OPTION_TIER_URL,
        OPTION_TO_TXID,
        OPTION_ZOOKEEPER,
    )

    options = {OPTION_ON_CORRUPT: on_corrupt}
    if config is None and zookeeper is None and not directories:
        config = resolve_config_path(None)
    if config is not None:
        loaded = load_tool_config(config) or Config({}, str(config))
        zookeeper = zookeeper or loaded.optional_str(KEY_CONNECT_STRING)
        cluster_root = cluster_root or loaded.optional_str(KEY_CLUSTER_ROOT)
        options[OPTION_CONFIG] = str(config.resolve())  # its TLS keys
    if directories:
        options[OPTION_PATHS] = ",".join(str(d.resolve()) for d in directories)
    if to_txid is not None:
        options[OPTION_TO_TXID] = str(to_txid)
    if zookeeper:
        options[OPTION_ZOOKEEPER] = zookeeper
    if cluster_root:
        options[OPTION_CLUSTER_ROOT] = cluster_root
    if partitions:
        options[OPTION_PARTITIONS] = partitions
    if tier_url:
        options[OPTION_TIER_URL] = tier_url
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
        f"{summary.rows} rows in {summary.files} files, {summary.elapsed_seconds:.1f} s "
        f"(of which the export job {summary.seconds:.1f} s, {summary.rows_per_s:,.0f} rows/s)"
        + _tier_note(summary)
        + ("; finished a killed run first" if summary.recovered_previous_run else "")
        + ("; watermarks published to ZooKeeper" if summary.published_to_zookeeper else "")
    )
    return table


def _tier_note(summary: ExportSummary) -> str:
    tier_rows = sum(p.tier_rows for p in summary.partitions)
    fallbacks = sum(p.tier_fallbacks for p in summary.partitions)
    if not tier_rows and not fallbacks:
        return ""
    fell_back = (
        f", {fallbacks} tier slice(s) finished over the network (see the Spark log)" if fallbacks else ""
    )
    return f"; {tier_rows} rows read from the tier" + (fell_back if fallbacks else "")


@app.command("export")
@one_line_errors
def export(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Directory of the export (hive-style partition=N/).")
    ],
    directories: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Storage directories to read as local files (default: the cluster, over the network).",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="Output format.")] = "parquet",
    partitions: Annotated[
        str | None,
        typer.Option("--partition", "-p", help="Partition ids and ranges, e.g. 0,2-3 (default all)."),
    ] = None,
    decoder: Annotated[
        str | None, typer.Option("--decoder", help="module:function; adds a 'decoded' text column.")
    ] = None,
    on_decode_error: Annotated[
        str,
        typer.Option(
            "--on-decode-error",
            help="A record the --decoder cannot read: fail (naming partition and transaction), "
            "skip it, or raw (kept with an empty 'decoded').",
        ),
    ] = "fail",
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
    to_txid: Annotated[
        int | None,
        typer.Option("--to-txid", help="Last txid to export (directories without a cluster need it)."),
    ] = None,
    tier_url: Annotated[
        str | None,
        typer.Option(
            "--tier-url",
            help="The storage nodes' storage.tier.url: what their tier holds is read from the object "
            "store itself, the rest over the network.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export the committed log to Parquet, all of it or (--incremental) only what is new.

    Reads the storage nodes over the network from the cluster (-c, or -z and -r); storage
    directories given as arguments are read as local files instead.

    Example: waltz spark export -o /data/export -c client.yml -p 0-3 --incremental
    """
    from spark.export import ExportConfig, check_config, finish_interrupted

    if old_partitions is not None:
        if partitions is not None:
            fail("give --partition (or its old spelling --partitions), not both")
        partitions = old_partitions

    export_config = ExportConfig(
        output=output.resolve(),
        read_options=_read_options(
            directories, zookeeper, cluster_root, config, partitions, on_corrupt, to_txid, tier_url
        ),
        format=output_format,
        decoder=decoder,
        on_decode_error=on_decode_error,
        incremental=incremental,
        export_id=export_id,
    )
    check_config(export_config)
    started = time.monotonic()
    try:
        summary = _run(export_config, master, as_json)
    except BaseException as e:
        if not _interrupted(e):
            raise
        if finish_interrupted(export_config.output):
            fail(
                "interrupted after the run's commit point: its files and watermarks are in", INTERRUPTED_EXIT
            )
        fail("interrupted: the export stopped, nothing of this run was committed", INTERRUPTED_EXIT)
    summary.elapsed_seconds = time.monotonic() - started
    if as_json:
        print_json(summary.to_json())
    else:
        console.print(_summary_table(summary))


def _interrupted(error: BaseException) -> bool:
    """A Ctrl-C, or an error raised while handling one: py4j, interrupted mid-call, tries to cancel
    on a gateway the same signal stopped and raises Py4JError with the KeyboardInterrupt as its
    context (seen under load: a traceback and exit 1 instead of one line and 130)."""
    seen: BaseException | None = error
    for _ in range(MAX_ERROR_CHAIN):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _run(export_config: ExportConfig, master: str, as_json: bool) -> ExportSummary:
    from spark.export import LOCAL_MASTER_PREFIX, LazySession, run_export, spark_log_path, spark_session
    from spark.submit import submit_export

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with progress_bar(as_json, _BytesColumn(), _RowsPerSecondColumn()) as progress:
        if not master.startswith(LOCAL_MASTER_PREFIX):
            progress.add_task(f"running on {master}", total=None)
            return submit_export(export_config, master)
        job = progress.add_task("starting Spark", total=None)
        session = LazySession(
            lambda: spark_session(master, quiet=True, jvm_log=spark_log_path(export_config.output))
        )
        try:
            bars = None if progress.disable else ExportBars(progress, job).update
            return run_export(session, export_config, bars)
        except KeyboardInterrupt:
            started = session.started
            if started is not None:
                started.sparkContext.cancelAllJobs()
            raise
        finally:
            session.stop()
