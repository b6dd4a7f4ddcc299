"""Export a Waltz log to Parquet with Spark: the library behind ``waltz spark export``.

A run: finish or discard what a killed run left (:func:`spark.commit.recover`); plan on the
driver — per partition from the output's watermark + 1 to the committed bound, which fixes
the run's exact txid ranges; let Spark tasks write those ranges, a slice each, into the staging
directory (:mod:`spark.export_task`); commit
(files moved in, ``watermarks.json`` replaced); publish the watermarks to ZooKeeper when it
is known. A non-incremental run is the same run into an output that must hold no export yet.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark import Accumulator
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark import commit
from spark.datasource import register
from spark.export_task import (
    ON_DECODE_ERROR_CHOICES,
    ON_DECODE_ERROR_FAIL,
    ExportTask,
    TaskResult,
    run_task,
    split,
)
from spark.layout import NO_TRANSACTION, discover
from spark.plan import PartitionPlan, ReadOptions, plan
from spark.progress import CountsParam, PartitionCounts, ProgressCallback, snapshot
from spark.schema import COLUMN_PARTITION
from spark.watermarks import load_file_watermarks, state_dir
from spark.worker_daemon import DAEMON_MODULE
from waltz_engine.common.errors import WaltzError
from waltz_engine.storage.network_reader import check_partition_ids, partition_count
from waltz_engine.zk.connection import connect
from waltz_engine.zk.export_watermarks import publish_export_watermarks

FORMAT_PARQUET = "parquet"
FORMATS = (FORMAT_PARQUET,)
DEFAULT_MASTER = "local[*]"
LOCAL_MASTER_PREFIX = "local"
DAEMON_MODULE_CONF = "spark.python.daemon.module"
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
APP_NAME = "waltz-export"
PROGRESS_POLL_S = 0.5
SPARK_LOG_NAME = "spark-local.log"
# pyspark's error class when the JVM exits before its gateway answers (no Java, a bad JAVA_HOME).
JVM_DID_NOT_START = "JAVA_GATEWAY_EXITED"
JAVA_ADVICE = "install Java 17 or later, or set JAVA_HOME to one"
LAUNCH_LOG_TAIL_BYTES = 4096
# The shell launcher's own complaint: "<spark-class>: line 71: /x/bin/java: No such file ...".
_LAUNCHER_LINE = re.compile(r": line \d+: (.+)$", re.MULTILINE)


class ExportError(WaltzError):
    """The export cannot run as asked."""


# A Python exception line inside Spark's report of a failed task ("module.Class: message").
_PYTHON_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
# Ours say what is wrong with the log; Java's and Spark's own wrappers only that a task failed.
_OWN_ERROR_PREFIXES = ("spark.", "waltz_engine.")
# One of ours anywhere in a line (with hidden tracebacks Spark puts it after its own words).
_OWN_ERROR = re.compile(r"(?:^|\s)((?:spark|waltz_engine)\.[\w.]*(?:Error|Exception)): (.+)$")
CORRUPT_RECORD_ADVICE = (
    "; `waltz inspect verify DIR` shows the damage, `--on-corrupt skip` exports without such records"
)


def task_failure(report: str) -> str | None:
    """The one line that says why a Spark task failed, from Spark's (very long) report of it."""
    found: list[tuple[str, str]] = []
    for line in report.splitlines():
        match = _OWN_ERROR.search(line.strip()) or _PYTHON_ERROR_LINE.match(line.strip())
        if match is not None:
            found.append((match.group(1), match.group(2).strip()))
    for name, message in found:
        if name.startswith(_OWN_ERROR_PREFIXES):
            advice = CORRUPT_RECORD_ADVICE if name.endswith("CorruptRecordError") else ""
            return f"{message}{advice}"
    return f"{found[-1][0]}: {found[-1][1]}" if found else None


@dataclass(frozen=True)
class ExportConfig:
    output: Path
    # Data source options (spark.plan): paths, zookeeper + cluster.root, partitions, on_corrupt...
    read_options: dict[str, str]
    format: str = FORMAT_PARQUET
    decoder: str | None = None
    on_decode_error: str = ON_DECODE_ERROR_FAIL
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
    # Rows read from the storage nodes' tier (tier.url), and tier slices that fell back to the
    # network (a damaged or unreadable tier copy; the job's log names the txids).
    tier_rows: int = 0
    tier_fallbacks: int = 0


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
    # The whole command's time, Spark's start included (``seconds`` is the export's own).
    elapsed_seconds: float = 0.0

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


@contextmanager
def _stderr_to(log: Path) -> Iterator[None]:
    """File descriptor 2 goes to ``log`` inside the block: a JVM started there keeps writing to
    the log (its banner, its warnings), this process gets its own stderr back after."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with log.open("ab") as out:
            os.dup2(out.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def spark_session(
    master: str = DEFAULT_MASTER, quiet: bool = False, jvm_log: Path | None = None
) -> SparkSession:
    """A session with the ``waltz`` source registered; Python workers run this interpreter. With
    ``jvm_log``, the JVM's own output (banner, warnings) goes there instead of stderr."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(APP_NAME)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if master.startswith(LOCAL_MASTER_PREFIX):
        builder = builder.config(DAEMON_MODULE_CONF, DAEMON_MODULE)
    if quiet:
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J}")
    try:
        if jvm_log is not None:
            with _stderr_to(jvm_log):
                session = builder.getOrCreate()
        else:
            session = builder.getOrCreate()
    except PySparkException as e:
        if e.getCondition() != JVM_DID_NOT_START:
            raise
        raise ExportError(f"Spark could not start its JVM{_launch_failure(jvm_log)}: {JAVA_ADVICE}") from None
    if quiet:
        # py4j logs the interrupted calls of a Ctrl-C as tracebacks; the command says it once.
        # Some go to its own logger, some to the root logger (``logging.exception``).
        logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)
        logging.getLogger().addFilter(_not_from_py4j)
        # A failed task is reported once, as one line (ExportError), not as Spark's log of it.
        session.sparkContext.setLogLevel("OFF")
    register(session)
    return session


class LazySession:
    """A Spark session started on first use: a run with nothing to write (an incremental export
    of a log that did not grow, the common scheduled case) plans on the driver and commits
    without ever starting a JVM (15-25 s of CPU saved per such run, measured)."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._session: SparkSession | None = None

    @property
    def started(self) -> SparkSession | None:
        return self._session

    def get(self) -> SparkSession:
        if self._session is None:
            self._session = self._start()
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()


def _launch_failure(jvm_log: Path | None) -> str:
    """Why the JVM did not start, from the launcher's words in the log (`` (...)``), if any."""
    if jvm_log is None or not jvm_log.is_file():
        return ""
    with jvm_log.open("rb") as log:
        log.seek(max(0, log.seek(0, os.SEEK_END) - LAUNCH_LOG_TAIL_BYTES))
        tail = log.read().decode(errors="replace")
    said = [m.group(1) for m in _LAUNCHER_LINE.finditer(tail)]
    return f" ({said[0]})" if said else ""


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


class _ProgressWatch:
    """The driver's view of a running export: the tasks' row and byte counts (an accumulator)
    and the status tracker's task counts, handed to ``callback`` every :data:`PROGRESS_POLL_S`
    by a thread of its own, and once more, final, when the job is over."""

    def __init__(self, session: SparkSession, plans: list[PartitionPlan], callback: ProgressCallback):
        self._context = session.sparkContext
        self._rows_to_do = {p.partition_id: p.count for p in plans}
        self._callback = callback
        self.counts: Accumulator[PartitionCounts] = self._context.accumulator({}, CountsParam())
        self._tasks = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _report(self) -> None:
        self._callback(snapshot(self._rows_to_do, self.counts.value, *self._tasks))

    def _poll(self) -> None:
        tracker = self._context.statusTracker()
        while not self._stop.wait(PROGRESS_POLL_S):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                self._tasks = (done, total)
            self._report()

    def __enter__(self) -> _ProgressWatch:
        self._report()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self._tasks = (self._tasks[1], self._tasks[1])
            self._report()


def _plans(options: ReadOptions, watermarks: dict[int, int]) -> list[PartitionPlan]:
    """From each partition's watermark + 1 (its exported part's end) to the committed bound."""
    return plan(replace(options, from_txids={p: t + 1 for p, t in watermarks.items()}))


def _write_staged(
    session: SparkSession,
    config: ExportConfig,
    options: ReadOptions,
    plans: list[PartitionPlan],
    counts: Accumulator[PartitionCounts] | None = None,
) -> list[TaskResult]:
    """The Spark job: one task per slice (see :mod:`spark.export_task`), files into staging;
    the tasks count their rows and bytes into ``counts`` when given."""
    staging = commit.staging_dir(config.output)
    staging.mkdir(parents=True)
    context = session.sparkContext
    tasks = [
        ExportTask(
            part, str(staging), options.on_corrupt, config.decoder, os.getcwd(), config.on_decode_error
        )
        for part in split([s for p in plans for s in p.slices], context.defaultParallelism)
    ]
    try:
        task = partial(run_task, count_batch=None if counts is None else counts.add)
        results: list[TaskResult] = context.parallelize(tasks, len(tasks)).map(task).collect()
    except (Py4JJavaError, PySparkException) as e:
        reason = task_failure(str(e)) or "see the Spark log"
        raise ExportError(f"the export job failed, nothing was committed: {reason}") from None
    assert sum(r.rows for r in results) <= sum(p.count for p in plans)
    return results


def _has_data(output: Path) -> bool:
    return output.is_dir() and any(p.name.startswith(f"{COLUMN_PARTITION}=") for p in output.iterdir())


def check_output(output: Path) -> None:
    """The output can be written: a directory (made if need be) where a file can be created."""
    if output.exists() and not output.is_dir():
        raise ExportError(f"--output {output} is a file, not a directory: give a directory")
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / f".waltz-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ExportError(
            f"cannot write to --output {output} ({e.strerror or e}): choose a directory you can write"
        ) from None


def check_config(config: ExportConfig) -> ReadOptions:
    """Fail fast, before a Spark session is started, on options that cannot work (output,
    partitions, the cluster or the directories); the parsed read options."""
    if config.format not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, got {config.format!r}")
    if config.on_decode_error not in ON_DECODE_ERROR_CHOICES:
        raise ExportError(
            f"--on-decode-error must be one of {', '.join(ON_DECODE_ERROR_CHOICES)}, "
            f"got {config.on_decode_error!r}"
        )
    options = ReadOptions.parse(config.read_options)
    check_output(config.output)
    if options.directories:
        found = sorted(discover(options.directories))
        if options.partitions is not None and not set(options.partitions) <= set(found):
            missing = sorted(set(options.partitions) - set(found))
            raise ExportError(
                f"partition(s) {', '.join(map(str, missing))} are in none of the storage directories "
                f"(they hold {', '.join(map(str, found)) or 'none'})"
            )
    if options.cluster is not None:
        count = partition_count(options.cluster)
        check_partition_ids(options.partitions if options.partitions is not None else [], count)
    return options


def run_export(
    session: SparkSession | LazySession, config: ExportConfig, progress: ProgressCallback | None = None
) -> ExportSummary:
    """One export run (see the module's doc). A :class:`LazySession` is started only when the
    plan holds rows to write."""
    options = check_config(config)
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
    plans = [p for p in _plans(options, watermarks) if p.count > 0]
    if plans:
        if isinstance(session, LazySession):
            session = session.get()
        if progress is None:
            results = _write_staged(session, config, options, plans)
        else:
            with _ProgressWatch(session, plans, progress) as watch:
                results = _write_staged(session, config, options, plans, watch.counts)
        new_marks = {p.partition_id: p.to_txid for p in plans}
        pending = commit.prepare(output, [r.file for r in results if r.file is not None], new_marks)
        commit.finish(output, pending)
        counts: dict[int, tuple[int, int, int]] = {}
        for result in results:
            rows, tier_rows, fallbacks = counts.get(result.partition_id, (0, 0, 0))
            counts[result.partition_id] = (
                rows + result.rows,
                tier_rows + result.tier_rows,
                fallbacks + result.tier_fallbacks,
            )
        summary.files = len(pending.files)
        for p in plans:
            wanted = watermarks.get(p.partition_id, NO_TRANSACTION) + 1
            missing = f"{wanted}..{p.from_txid - 1}" if p.from_txid > wanted else None
            rows, tier_rows, fallbacks = counts.get(p.partition_id, (0, 0, 0))
            summary.partitions.append(
                PartitionSummary(
                    p.partition_id, p.from_txid, p.to_txid, rows, p.to_txid, missing, tier_rows, fallbacks
                )
            )
            summary.rows += rows
    summary.published_to_zookeeper = _publish(config, options)
    summary.seconds = time.monotonic() - started
    return summary


def spark_log_path(output: Path) -> Path:
    """Where a local run's JVM writes its own output (kept in the output's state directory)."""
    return state_dir(output) / SPARK_LOG_NAME


def finish_interrupted(output: Path) -> bool:
    """After an interrupted run: its staging goes, unless it passed its commit point, in which
    case it is finished (True)."""
    return commit.recover(output)


def _publish(config: ExportConfig, options: ReadOptions) -> bool:
    """Publish the output's durable watermarks (all partitions) to ZooKeeper, when it is given."""
    marks = load_file_watermarks(config.output)
    if options.zookeeper is None or not marks:
        return False
    with connect(options.zookeeper) as client:
        publish_export_watermarks(client, options.zookeeper.cluster_root, config.resolved_export_id, marks)
    return True
