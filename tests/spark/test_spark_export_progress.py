"""The export's progress (spark.progress, the CLI's ExportBars): the tasks count rows and bytes per
partition, the driver turns the counts into rows done of the rows to do, the terminal shows them;
the summary and the JSON stay what they were."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from rich.progress import Progress
from spark_support import (
    CLI_TIMEOUT_S,
    configure_spark_environment,
    local_spark_session,
    spark_cli_command,
    writable_clean_storage,
)

from spark.export import ExportConfig, run_export
from spark.export_task import ExportTask, run_task
from spark.plan import OPTION_PATHS, OPTION_TO_TXID, ReadOptions, plan
from spark.progress import CountsParam, ExportProgress, PartitionCounts, PartitionProgress, snapshot
from spark.segments import ON_CORRUPT_FAIL
from spark.watermarks import load_file_watermarks
from waltz_cli.commands.spark import ExportBars

BEYOND_EVERY_TXID = "1000000"
EXPECTED_ROWS = 279  # the clean vectors' committed records


@pytest.fixture
def storage(vectors: Path, tmp_path: Path) -> Path:
    return writable_clean_storage(vectors, tmp_path)


def read_options(storage: Path) -> dict[str, str]:
    return {OPTION_PATHS: str(storage), OPTION_TO_TXID: BEYOND_EVERY_TXID}


def test_counts_add_up_per_partition_without_changing_what_was_read() -> None:
    param = CountsParam()
    seen: PartitionCounts = {0: (10, 100)}
    merged = param.addInPlace(seen, {0: (5, 50), 2: (1, 7)})
    assert merged == {0: (15, 150), 2: (1, 7)}
    assert seen == {0: (10, 100)}  # a reader holding the old value never sees it half merged
    assert param.addInPlace(param.zero({}), {}) == {}


def test_snapshot_lists_every_planned_partition_capped_at_its_rows_to_do() -> None:
    state = snapshot({3: 10, 1: 4, 2: 5}, {1: (4, 40), 3: (12, 120)}, 2, 5)
    assert state.partitions == (
        PartitionProgress(1, 4, 4, 40),
        PartitionProgress(2, 0, 5, 0),  # no task of it has ended yet
        PartitionProgress(3, 10, 10, 120),  # a stage run twice counted a task twice
    )
    assert (state.rows, state.rows_total, state.tasks_done, state.tasks_total) == (14, 19, 2, 5)


def test_a_task_counts_each_batch_it_writes(storage: Path, tmp_path: Path) -> None:
    part = next(s for p in plan(ReadOptions.parse(read_options(storage))) for s in p.slices if s.count)
    counts: list[PartitionCounts] = [{}]
    result = run_task(
        ExportTask(part, str(tmp_path), ON_CORRUPT_FAIL),
        lambda batch: counts.append(CountsParam().addInPlace(counts[-1], batch)),
    )
    assert len(counts) > 1
    rows, size = counts[-1][part.partition_id]
    assert list(counts[-1]) == [part.partition_id]
    assert rows == result.rows == part.count and size > 0


def test_the_bars_show_rows_of_rows_to_do_and_bytes_per_partition() -> None:
    progress = Progress(disable=True)
    job = progress.add_task("starting Spark", total=None)
    bars = ExportBars(progress, job)
    bars.update(snapshot({0: 10, 1: 6}, {}, 0, 0))
    bars.update(snapshot({0: 10, 1: 6}, {0: (4, 400), 1: (6, 60)}, 1, 3))
    by_name = {t.description.strip(): t for t in progress.tasks}
    assert by_name["exporting (1/3 tasks)"].completed == 10 and by_name["exporting (1/3 tasks)"].total == 16
    assert (by_name["partition 0"].completed, by_name["partition 0"].total) == (4, 10)
    assert by_name["partition 0"].fields["bytes"] == 400
    assert (by_name["partition 1"].completed, by_name["partition 1"].total) == (6, 6)
    assert len(progress.tasks) == 3  # a partition's line is made once


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    with local_spark_session() as spark:
        yield spark


def test_an_export_reports_each_partitions_rows_and_bytes_through_spark(
    session: SparkSession, storage: Path, tmp_path: Path
) -> None:
    seen: list[ExportProgress] = []
    config = ExportConfig(output=tmp_path / "export", read_options=read_options(storage))
    summary = run_export(session, config, seen.append)
    final = seen[-1]
    assert seen[0].rows == 0 and final.rows == summary.rows == EXPECTED_ROWS
    assert {p.partition: p.rows for p in final.partitions} == {
        p.partition: p.rows for p in summary.partitions
    }
    assert all(p.rows == p.rows_total and p.bytes > 0 for p in final.partitions)
    assert set(summary.to_json()) >= {
        "rows",
        "files",
        "seconds",
        "elapsed_seconds",
        "rows_per_s",
        "partitions",
    }


def _export_cli(
    storage: Path, output: Path, *extra: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`waltz spark export` of ``storage`` into ``output`` in a process of its own (local[2])."""
    configure_spark_environment()
    command = spark_cli_command("export", "-o", str(output), "-m", "local[2]", "--to-txid", BEYOND_EVERY_TXID)
    return subprocess.run(
        [*command, *extra, str(storage)],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_on_a_terminal_the_command_shows_the_bars_and_still_prints_its_summary(
    storage: Path, tmp_path: Path
) -> None:
    terminal = {**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    output = tmp_path / "export"
    shown = _export_cli(storage, output, env=terminal)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "partition 0" in shown.stderr and "rows/s" in shown.stderr
    assert f"{EXPECTED_ROWS} rows in" in shown.stdout
    # Nothing new to export: the run plans, commits nothing and starts no JVM, so it succeeds
    # where no Java could start (JAVA_HOME names none; Spark's launcher would fail on it).
    no_java = {**terminal, "JAVA_HOME": str(tmp_path / "no-java")}
    quiet = _export_cli(storage, output, "--incremental", "--json", env=no_java)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == ""  # --json: no bars even on a terminal
    assert json.loads(quiet.stdout)["rows"] == 0


def test_without_a_java_to_start_the_export_fails_with_one_line_and_commits_nothing(
    storage: Path, tmp_path: Path
) -> None:
    output = tmp_path / "export"
    result = _export_cli(storage, output, env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java")})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: Spark could not start its JVM ({tmp_path / 'no-java'}/bin/java: No such file or directory): "
        "install Java 17 or later, or set JAVA_HOME to one"
    ]
    assert load_file_watermarks(output) == {} and not list(output.glob("partition=*"))
