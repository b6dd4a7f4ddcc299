"""The executor side of the export (spark.export_task), run in this process: how the plan is cut
into tasks, and what one task leaves in the staging directory."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark.export import CORRUPT_RECORD_ADVICE, task_failure
from spark.export_task import TASK_MAX_ROWS, TASK_MIN_ROWS, ExportTask, file_name, run_task, split
from spark.plan import OPTION_PATHS, OPTION_TO_TXID, ReadOptions, plan
from spark.schema import COLUMN_PARTITION
from spark.segments import ON_CORRUPT_FAIL, SegmentSlice, read_slice
from spark.submit import submit_failure


def covered(tasks: list[SegmentSlice]) -> list[tuple[int, int]]:
    return [(t.partition_id, txid) for t in tasks for txid in range(t.from_txid, t.to_txid + 1)]


def test_split_balances_cores_bounds_files_and_covers_every_txid_once() -> None:
    a = SegmentSlice(0, "/a.seg", 0, 0, 499_999)
    b = SegmentSlice(1, "/b.seg", 0, 0, 499_999)
    assert split([a, b], 2) == [a, b]  # already one per core
    big = SegmentSlice(2, "/big.seg", 100, 100, 100 + 3 * TASK_MAX_ROWS - 1)
    tasks = split([big], 2)
    assert len(tasks) == 3 and max(t.count for t in tasks) <= TASK_MAX_ROWS
    assert covered(tasks) == covered([big])
    one = SegmentSlice(3, "/one.seg", 0, 0, 2 * TASK_MIN_ROWS - 1)
    tasks = split([one], 8)  # more cores than rows justify: never below TASK_MIN_ROWS a task
    assert len(tasks) == 2 and min(t.count for t in tasks) == TASK_MIN_ROWS
    assert covered(tasks) == covered([one])
    assert split([SegmentSlice(4, "/tiny.seg", 0, 5, 6)], 2) == [SegmentSlice(4, "/tiny.seg", 0, 5, 6)]
    assert split([SegmentSlice(5, "/empty.seg", 0, 5, 4)], 2) == []  # nothing to read, no task


@pytest.fixture
def slices(vectors: Path) -> list[SegmentSlice]:
    storage = vectors / "disk/clean/storage"
    options = ReadOptions.parse({OPTION_PATHS: str(storage), OPTION_TO_TXID: "1000000"})
    return [s for p in plan(options) for s in p.slices]


def test_a_task_writes_its_slice_once_whatever_the_attempts(
    slices: list[SegmentSlice], tmp_path: Path
) -> None:
    part = slices[0]
    task = ExportTask(part, str(tmp_path), ON_CORRUPT_FAIL)
    first = run_task(task)
    written = (tmp_path / file_name(part)).read_bytes()
    second = run_task(task)  # a retried or speculative attempt
    assert first == second
    assert first.file == file_name(part) and first.rows == part.count
    assert (tmp_path / file_name(part)).read_bytes() == written
    assert sorted(p.name for p in (tmp_path / f"{COLUMN_PARTITION}={part.partition_id}").iterdir()) == [
        Path(file_name(part)).name  # no temporary file left behind
    ]
    expected = [b.drop_columns([COLUMN_PARTITION]) for b in read_slice(part)]
    table = pq.read_table(tmp_path / file_name(part))
    assert table.to_pylist() == [row for b in expected for row in b.to_pylist()]


def test_a_task_with_no_rows_writes_no_file(slices: list[SegmentSlice], tmp_path: Path) -> None:
    empty = SegmentSlice(slices[0].partition_id, slices[0].path, slices[0].first_txid, 5, 4)
    assert run_task(ExportTask(empty, str(tmp_path), ON_CORRUPT_FAIL)).file is None
    assert not any(tmp_path.rglob("*.parquet"))


SPARK_TASK_FAILURE = """py4j.protocol.Py4JJavaError: An error occurred while calling collectAndServe.
org.apache.spark.SparkException: Job aborted due to stage failure: Task 4 in stage 0.0 failed 1 times
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/site-packages/pyspark/worker.py", line 4327, in invoke_udf
spark.segments.CorruptRecordError: /data/1/00.seg: partition 1 transaction 0: record checksum mismatch
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1097)
"""


def test_a_failed_job_is_told_in_one_line_from_the_tasks_own_error() -> None:
    assert task_failure(SPARK_TASK_FAILURE) == (
        "/data/1/00.seg: partition 1 transaction 0: record checksum mismatch" + CORRUPT_RECORD_ADVICE
    )
    # With hidden tracebacks (what `register` turns on), Spark puts the error after its own words.
    hidden = (
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from "
        "the Python worker: spark.segments.CorruptRecordError: /data/1/00.seg: record checksum mismatch\n"
    )
    assert task_failure(hidden) == "/data/1/00.seg: record checksum mismatch" + CORRUPT_RECORD_ADVICE
    other = "java.lang.OutOfMemoryError: Java heap space\nValueError: bad value\n"
    assert task_failure(other) == "ValueError: bad value"  # the last Python-looking error
    assert task_failure("nothing recognizable") is None
    log = "INFO Connecting to master spark://h:7077...\nWARN Failed to connect to master h:7077\n"
    assert "cannot connect to the Spark master h:7077" in submit_failure(log)
    assert submit_failure("INFO a\nERROR the very last line\n\n") == "ERROR the very last line"
