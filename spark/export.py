"""Export a Waltz log to Parquet with Spark: the library behind ``waltz spark export``.

A run: finish or discard what a killed run left (:func:`spark.commit.recover`); plan on the
driver — per partition from the output's watermark + 1 to the committed bound, which fixes
the run's exact txid ranges; let Spark write those ranges into the staging directory; commit
(files moved in, ``watermarks.json`` replaced); publish the watermarks to ZooKeeper when it
is known. A non-incremental run is the same run into an output that must hold no export yet.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from spark import commit
from spark.datasource import DATA_SOURCE_NAME, register
from spark.layout import NO_TRANSACTION, discover
from spark.plan import (
    OPTION_CLUSTER_ROOT,
    OPTION_FROM_TXIDS,
    OPTION_TO_TXIDS,
    OPTION_ZOOKEEPER,
    PartitionPlan,
    ReadOptions,
    plan,
)
from spark.schema import COLUMN_DATA, COLUMN_DECODED, COLUMN_PARTITION, SPARK_SCHEMA
from spark.watermarks import load_file_watermarks
from waltz_engine.errors import WaltzError
from waltz_engine.zk.connection import connect
from waltz_engine.zk.export_watermarks import publish_export_watermarks

FORMAT_PARQUET = "parquet"
FORMATS = (FORMAT_PARQUET,)
DEFAULT_MASTER = "local[*]"
APP_NAME = "waltz-export"
PROGRESS_POLL_S = 0.5
# Parquet writer options. Record payloads are mostly distinct, so a dictionary for the data
# column is built per page only to be abandoned for plain encoding; skipping it made the
# 2 M-row benchmark's write about a third faster (docs/benchmarks.md).
PARQUET_WRITE_OPTIONS = {f"parquet.enable.dictionary#{COLUMN_DATA}": "false"}

# (tasks done, tasks in the job) while Spark writes.
ProgressCallback = Callable[[int, int], None]


class ExportError(WaltzError):
    """The export cannot run as asked."""


@dataclass(frozen=True)
class ExportConfig:
    output: Path
    # Data source options (spark.plan): paths, zookeeper + cluster.root, partitions, on_corrupt...
    read_options: dict[str, str]
    format: str = FORMAT_PARQUET
    decoder: str | None = None
    incremental: bool = False
    export_id: str | None = None

    @property
    def resolved_export_id(self) -> str:
        """Stable across runs into the same output: its directory name unless given."""
        return self.export_id or self.output.resolve().name

    def to_json(self) -> dict[str, Any]:
        value = asdict(self)
        value["output"] = str(self.output)
        return value

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ExportConfig:
        return cls(**{**value, "output": Path(value["output"])})


@dataclass(frozen=True)
class PartitionSummary:
    partition: int
    from_txid: int
    to_txid: int
    rows: int
    watermark: int
    # Txids the export wanted but retention had already removed ("a..b"), if any.
    missing: str | None = None


@dataclass
class ExportSummary:
    export_id: str
    output: str
    incremental: bool
    recovered_previous_run: bool
    rows: int = 0
    files: int = 0
    seconds: float = 0.0
    published_to_zookeeper: bool = False
    partitions: list[PartitionSummary] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        value = asdict(self)
        value["rows_per_s"] = round(self.rows_per_s, 1)
        return value

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ExportSummary:
        value = {k: v for k, v in value.items() if k != "rows_per_s"}
        value["partitions"] = [PartitionSummary(**p) for p in value["partitions"]]
        return cls(**value)


def spark_session(master: str = DEFAULT_MASTER) -> SparkSession:
    """A session with the ``waltz`` source registered; Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(master)
        .appName(APP_NAME)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    register(session)
    return session


def _decode_batches(spec: str, cwd: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function adding the decoded data as text; it imports the user's decoder in
    the worker, looking in the driver's working directory as ``--decoder`` does there."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if cwd not in sys.path:
            sys.path.append(cwd)
        from waltz_cli.decoder import load_decoder

        decode = load_decoder(spec)
        for batch in batches:
            values = [_as_text(decode(d)) for d in batch.column(COLUMN_DATA).to_pylist()]
            yield batch.append_column(COLUMN_DECODED, pa.array(values, type=pa.string()))

    return run


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def dataframe(session: SparkSession, read_options: dict[str, str], decoder: str | None) -> DataFrame:
    df = session.read.format(DATA_SOURCE_NAME).options(**read_options).load()
    if decoder is None:
        return df
    schema = StructType([*SPARK_SCHEMA.fields, StructField(COLUMN_DECODED, StringType(), nullable=True)])
    return df.mapInArrow(_decode_batches(decoder, os.getcwd()), schema)


def _watch_progress(session: SparkSession, progress: ProgressCallback, stop: threading.Event) -> None:
    tracker = session.sparkContext.statusTracker()
    while not stop.wait(PROGRESS_POLL_S):
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if total:
            progress(done, total)


def _plans(config: ExportConfig, watermarks: dict[int, int]) -> list[PartitionPlan]:
    options = dict(config.read_options)
    options[OPTION_FROM_TXIDS] = json.dumps({str(p): t + 1 for p, t in watermarks.items()})
    return plan(ReadOptions.parse(options))


def _job_options(config: ExportConfig, plans: list[PartitionPlan]) -> dict[str, str]:
    """The run's exact ranges; ZooKeeper is left out: the bound was fixed when planning."""
    options = {
        k: v for k, v in config.read_options.items() if k not in (OPTION_ZOOKEEPER, OPTION_CLUSTER_ROOT)
    }
    options[OPTION_FROM_TXIDS] = json.dumps({str(p.partition_id): p.from_txid for p in plans})
    options[OPTION_TO_TXIDS] = json.dumps({str(p.partition_id): p.to_txid for p in plans})
    options["partitions"] = ",".join(str(p.partition_id) for p in plans)
    return options


def _has_data(output: Path) -> bool:
    return output.is_dir() and any(p.name.startswith(f"{COLUMN_PARTITION}=") for p in output.iterdir())


def _count_rows(output: Path, files: tuple[str, ...]) -> dict[int, int]:
    """Rows per partition of the staged files (Parquet footers only)."""
    counts: dict[int, int] = {}
    staging = commit.staging_dir(output)
    for name in files:
        partition_id = int(Path(name).parts[0].split("=", 1)[1])
        counts[partition_id] = counts.get(partition_id, 0) + pq.read_metadata(staging / name).num_rows
    return counts


def check_config(config: ExportConfig) -> None:
    """Fail fast, before a Spark session is started, on options that cannot work."""
    if config.format not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, got {config.format!r}")
    discover(ReadOptions.parse(config.read_options).directories)


def run_export(
    session: SparkSession, config: ExportConfig, progress: ProgressCallback | None = None
) -> ExportSummary:
    check_config(config)
    started = time.monotonic()
    output = config.output
    output.mkdir(parents=True, exist_ok=True)
    summary = ExportSummary(
        config.resolved_export_id, str(output), config.incremental, commit.recover(output)
    )
    watermarks = load_file_watermarks(output)
    if not config.incremental and (watermarks or _has_data(output)):
        raise ExportError(
            f"{output} already holds an export: pass --incremental to add to it, or use a new directory"
        )
    plans = [p for p in _plans(config, watermarks) if p.count > 0]
    if plans:
        stop = threading.Event()
        watcher = None
        if progress is not None:
            watcher = threading.Thread(target=_watch_progress, args=(session, progress, stop), daemon=True)
            watcher.start()
        try:
            df = dataframe(session, _job_options(config, plans), config.decoder)
            writer = df.write.mode("overwrite").options(**PARQUET_WRITE_OPTIONS).partitionBy(COLUMN_PARTITION)
            writer.parquet(str(commit.staging_dir(output)))
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()
        new_marks = {p.partition_id: p.to_txid for p in plans}
        pending = commit.prepare(output, new_marks)
        counts = _count_rows(output, pending.files)
        commit.finish(output, pending)
        summary.files = len(pending.files)
        for p in plans:
            wanted = watermarks.get(p.partition_id, NO_TRANSACTION) + 1
            missing = f"{wanted}..{p.from_txid - 1}" if p.from_txid > wanted else None
            rows = counts.get(p.partition_id, 0)
            summary.partitions.append(
                PartitionSummary(p.partition_id, p.from_txid, p.to_txid, rows, p.to_txid, missing)
            )
            summary.rows += rows
    summary.published_to_zookeeper = _publish(config)
    summary.seconds = time.monotonic() - started
    return summary


def _publish(config: ExportConfig) -> bool:
    """Publish the output's durable watermarks (all partitions) to ZooKeeper, when it is given."""
    options = ReadOptions.parse(config.read_options)
    marks = load_file_watermarks(config.output)
    if options.zookeeper is None or not marks:
        return False
    with connect(options.zookeeper) as client:
        publish_export_watermarks(client, options.zookeeper.cluster_root, config.resolved_export_id, marks)
    return True
