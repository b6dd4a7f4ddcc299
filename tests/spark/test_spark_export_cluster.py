"""`waltz spark export` and the streaming source against real clusters: one Waltz cluster's log,
exported by the CLI, in-process, on a Spark standalone master, and streamed, over the network
(the killed export reads local storage directories); a storage node killed during a network
export, and Ctrl-C.

Time goes into JVM starts, so the module shares one Waltz cluster and one in-process Spark
session; the CLI (a JVM each) runs only where the test is about the process itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_support import TailRow, append_lines, module_cluster
from cluster_support import tailed as tailed_rows
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from spark_support import (
    LOCAL_MASTER,
    configure_spark_environment,
    exported_rows,
    local_spark_session,
    run_spark_cli,
    spark_cli_command,
    standalone_cluster,
)

from spark.datasource import DATA_SOURCE_NAME, SlicePartition, WaltzStreamReader
from spark.export import ExportConfig, ExportError, ExportSummary, run_export
from spark.layout import NO_TRANSACTION
from spark.plan import OPTION_CLUSTER_ROOT, OPTION_PATHS, OPTION_ZOOKEEPER, ReadOptions
from spark.schema import COLUMN_DATA, COLUMN_DECODED, COLUMN_PARTITION, COLUMN_TRANSACTION_ID, SPARK_SCHEMA
from spark.watermarks import STATE_DIR_NAME
from waltz_engine.ops.devcluster import LocalCluster

PARTITIONS = (0, 1)
# Bounds waits for something that must happen (never asserted on as a duration).
WAIT_DEADLINE_S = 90.0
POLL_S = 0.05
# Some bulk for the killed export to be writing; any moment of the kill is a valid test (the
# Spark job outlives its staging directory's creation by at least a Python worker's start).
KILL_ROWS_PER_PARTITION = 300
STREAM_TRIGGER_INTERVAL = "500 milliseconds"
TEST_DECODER = "spark_test_decoder:utf8"
TESTS_DIR = Path(__file__).parent


cluster = module_cluster(storages=2, partitions=len(PARTITIONS))


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    with local_spark_session() as s:
        yield s


def storage_dirs(cluster: LocalCluster) -> list[str]:
    return [str(node.directory / "data") for node in cluster.storages]


def read_options(cluster: LocalCluster) -> dict[str, str]:
    """The cluster only: records are read over the network from the storage nodes."""
    return {OPTION_ZOOKEEPER: cluster.zookeeper, OPTION_CLUSTER_ROOT: cluster.cluster_root}


def append(cluster: LocalCluster, lines_by_partition: dict[int, list[str]]) -> None:
    append_lines(cluster, lines_by_partition)


def tailed(cluster: LocalCluster) -> list[TailRow]:
    return tailed_rows(cluster, PARTITIONS)


def as_tail(rows: list[dict[str, Any]]) -> list[TailRow]:
    return [
        (
            r["partition"],
            r["transaction_id"],
            r["client_id"],
            r["generation"],
            r["seq_num"],
            r["header"],
            bytes(r[COLUMN_DATA]).hex(),
        )
        for r in rows
    ]


def export_cli(cluster: LocalCluster, output: Path, *extra: str) -> dict[str, Any]:
    result = run_spark_cli(
        "export",
        "--output",
        str(output),
        "--config",
        str(cluster.client_config_path),
        "--json",
        *extra,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # no JVM banner, no log lines
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def export_in_process(
    session: SparkSession, cluster: LocalCluster, output: Path, **config: Any
) -> ExportSummary:
    return run_export(session, ExportConfig(output=output, read_options=read_options(cluster), **config))


def test_export_equals_tail_and_incremental_adds_only_new_rows(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    append(cluster, {p: [f"p{p}-first-{i}" for i in range(20)] for p in PARTITIONS})
    output = tmp_path / "export"
    # In this process: the command's own output (a JSON summary, no JVM banner) is checked on
    # the standalone master below, and a second JVM here costs ~12 s of CPU.
    first = export_in_process(session, cluster, output)
    assert first.published_to_zookeeper is True
    assert as_tail(exported_rows(output)) == tailed(cluster)
    before = len(exported_rows(output))

    append(cluster, {p: [f"p{p}-second-{i}" for i in range(7)] for p in PARTITIONS})
    summary = export_in_process(session, cluster, output, incremental=True)
    assert summary.rows == len(PARTITIONS) * 7
    rows = exported_rows(output)
    assert len(rows) == before + len(PARTITIONS) * 7
    assert as_tail(rows) == tailed(cluster)
    assert summary.published_to_zookeeper is True


def test_decoder_adds_the_decoded_text(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(cluster, {0: ["décodé-1", "plain-2"]})
    # --decoder finds modules in the working directory, on the driver and in the workers.
    monkeypatch.chdir(TESTS_DIR)
    output = tmp_path / "decoded"
    summary = export_in_process(session, cluster, output, decoder=TEST_DECODER)
    rows = exported_rows(output)
    assert summary.rows == len(rows) > 0
    assert all(r[COLUMN_DECODED] == bytes(r[COLUMN_DATA]).decode() for r in rows)
    assert "décodé-1" in {r[COLUMN_DECODED] for r in rows}


def test_a_record_the_decoder_cannot_read_is_named_or_skipped_or_kept_raw(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append(cluster, {1: ["readable-1", "unreadable-2", "readable-3"]})
    bad = next(r for r in tailed(cluster) if bytes.fromhex(r[6]) == b"unreadable-2")
    monkeypatch.chdir(TESTS_DIR)
    decoder = "spark_test_decoder:picky"
    with pytest.raises(ExportError) as failed:
        export_in_process(session, cluster, tmp_path / "fail", decoder=decoder)
    assert (
        f"cannot read partition 1 transaction {bad[1]} (ValueError: not a record this decoder knows)"
        in str(failed.value)
    )
    assert "--on-decode-error skip or raw" in str(failed.value)

    export_in_process(session, cluster, tmp_path / "skip", decoder=decoder, on_decode_error="skip")
    skipped = {(r[COLUMN_PARTITION], r[COLUMN_TRANSACTION_ID]) for r in exported_rows(tmp_path / "skip")}
    export_in_process(session, cluster, tmp_path / "raw", decoder=decoder, on_decode_error="raw")
    raw = {(r[COLUMN_PARTITION], r[COLUMN_TRANSACTION_ID]): r for r in exported_rows(tmp_path / "raw")}
    assert skipped == set(raw) - {(1, bad[1])}
    assert raw[(1, bad[1])][COLUMN_DECODED] is None
    assert bytes(raw[(1, bad[1])][COLUMN_DATA]) == b"unreadable-2"


def test_killed_export_rerun_loses_and_duplicates_nothing(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    append(cluster, {p: [f"bulk-{i}" for i in range(KILL_ROWS_PER_PARTITION)] for p in PARTITIONS})
    output = tmp_path / "killed"
    configure_spark_environment()
    process = subprocess.Popen(
        spark_cli_command(
            "export",
            "--output",
            str(output),
            "--config",
            str(cluster.client_config_path),
            "--master",
            LOCAL_MASTER,
            *storage_dirs(cluster),
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    staging = output / STATE_DIR_NAME / "staging"
    try:
        deadline = time.monotonic() + WAIT_DEADLINE_S
        while not staging.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert staging.exists(), "the export never started writing"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and the Spark JVM it started
        process.wait()
    summary = export_in_process(session, cluster, output, incremental=True)
    assert summary.recovered_previous_run in (True, False)  # killed before or after its commit point
    assert as_tail(exported_rows(output)) == tailed(cluster)


def test_standalone_master_export_equals_the_local_one(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    append(cluster, {1: [f"standalone-{i}" for i in range(5)]})
    local, remote = tmp_path / "local", tmp_path / "remote"
    local_summary = export_in_process(session, cluster, local)
    with standalone_cluster(tmp_path / "standalone") as master:
        # No storage directory is named: the executors read the storage nodes over the network.
        remote_summary = export_cli(cluster, remote, "--master", master)
    assert remote_summary["rows"] == local_summary.rows > 0
    assert exported_rows(remote) == exported_rows(local)
    assert as_tail(exported_rows(remote)) == tailed(cluster)


def _delivered(query: StreamingQuery) -> dict[str, int]:
    """The end offset ({"partition": last txid}) of the query's last finished micro-batch."""
    progress = query.lastProgress
    if progress is None or not progress.sources:
        return {}
    end = progress.sources[0].endOffset
    offset: dict[str, int] = json.loads(end) if isinstance(end, str) else end
    return offset or {}


def test_stream_delivers_appends_exactly_once_across_a_restart(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start() -> StreamingQuery:
        df = session.readStream.format(DATA_SOURCE_NAME).options(**read_options(cluster)).load()
        return (
            df.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=STREAM_TRIGGER_INTERVAL)
            .start()
        )

    def wait_until_delivered(query: StreamingQuery, expected: list[TailRow]) -> None:
        # The query's own progress, not the sink: polling the sink would run a Spark job each time.
        # An empty partition's offset is NO_TRANSACTION.
        want = {
            str(p): max((t for q, t, *_ in expected if q == p), default=NO_TRANSACTION) for p in PARTITIONS
        }
        deadline = time.monotonic() + WAIT_DEADLINE_S
        while _delivered(query) != want and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(POLL_S)
        assert _delivered(query) == want

    def sink_rows() -> list[tuple[int, int]]:
        # Through Spark: it reads only the files the sink's _spark_metadata log committed.
        found = session.read.schema(SPARK_SCHEMA).parquet(str(sink)).select("partition", "transaction_id")
        return sorted((r.partition, r.transaction_id) for r in found.collect())

    query = start()
    try:
        wait_until_delivered(query, tailed(cluster))
        append(cluster, {0: [f"stream-a-{i}" for i in range(5)]})
        wait_until_delivered(query, tailed(cluster))
    finally:
        query.stop()
    append(cluster, {1: [f"stream-b-{i}" for i in range(4)]})  # while stopped
    query = start()  # from the checkpoint
    try:
        append(cluster, {0: [f"stream-c-{i}" for i in range(3)]})  # while running again
        expected = tailed(cluster)
        wait_until_delivered(query, expected)
    finally:
        query.stop()
    assert sink_rows() == sorted((p, t) for p, t, *_ in expected)  # every committed transaction once


def test_stream_end_offsets_above_the_committed_mark_are_capped_at_it(cluster: LocalCluster) -> None:
    """A micro-batch replayed from a checkpoint written before the log was rolled back (a store
    restored from a backup) has end offsets above the committed mark of now. What lies above it
    is not committed (here: nothing yet; in general a new session's appends in flight) and is
    not planned, over the network nor from the storage directories."""
    append(cluster, {p: [f"capped-{p}-{i}" for i in range(3)] for p in PARTITIONS})
    committed = {p: max(t for q, t, *_ in tailed(cluster) if q == p) for p in PARTITIONS}
    start = {str(p): NO_TRANSACTION for p in PARTITIONS}
    stale_end = {str(p): committed[p] + 50 for p in PARTITIONS}
    local = {**read_options(cluster), OPTION_PATHS: ",".join(storage_dirs(cluster))}
    for options in (read_options(cluster), local):
        reader = WaltzStreamReader(ReadOptions.parse(options))
        planned: dict[int, list[int]] = {}
        for partition in reader.partitions(start, stale_end):
            assert isinstance(partition, SlicePartition)
            part = partition.part
            planned.setdefault(part.partition_id, []).extend(range(part.from_txid, part.to_txid + 1))
        assert planned == {p: list(range(committed[p] + 1)) for p in PARTITIONS}, options


def test_partitions_and_output_are_checked_before_spark_starts(cluster: LocalCluster, tmp_path: Path) -> None:
    config = str(cluster.client_config_path)
    # --partitions 99 on a 2-partition cluster used to exit 0 with an empty output.
    result = run_spark_cli("export", "-o", str(tmp_path / "out"), "-c", config, "--partitions", "99")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: Partition 99 does not belong to the cluster (it has partitions 0-1)"
    ]
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = run_spark_cli("export", "-o", str(a_file), "-c", config)
    assert result.returncode == 1 and "is a file, not a directory" in result.stderr
    assert "JAVA" not in result.stderr.upper()  # refused before any JVM started


def _wait_for_staging(output: Path, running: Callable[[], bool]) -> None:
    """Until the export's Spark job is about to read (its staging directory exists)."""
    staging = output / STATE_DIR_NAME / "staging"
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while not staging.exists() and running() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert staging.exists(), "the export never started writing"


def test_storage_node_killed_during_a_network_export_loses_nothing(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    append(cluster, {p: [f"node-kill-{i}" for i in range(KILL_ROWS_PER_PARTITION)] for p in PARTITIONS})
    expected = tailed(cluster)
    output = tmp_path / "node-killed"
    victim = cluster.storages[0]
    outcome: list[ExportSummary | BaseException] = []

    def export() -> None:
        try:
            outcome.append(export_in_process(session, cluster, output))
        except BaseException as e:  # reported by the test's thread
            outcome.append(e)

    thread = threading.Thread(target=export)
    thread.start()
    try:
        # The plan is made (its slices start on both replicas); the tasks are starting to read.
        _wait_for_staging(output, thread.is_alive)
        victim.kill()
        thread.join(WAIT_DEADLINE_S)
        assert not thread.is_alive(), "the export did not finish without the killed node"
    finally:
        victim.start()
    (summary,) = outcome
    assert isinstance(summary, ExportSummary), summary
    assert summary.rows == len(expected)
    assert as_tail(exported_rows(output)) == expected


def test_ctrl_c_stops_a_network_export_removes_staging_and_says_one_line(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    append(cluster, {p: [f"interrupted-{i}" for i in range(KILL_ROWS_PER_PARTITION)] for p in PARTITIONS})
    output = tmp_path / "interrupted"
    configure_spark_environment()
    process = subprocess.Popen(
        spark_cli_command(
            "export", "--output", str(output), "--config", str(cluster.client_config_path), "-m", LOCAL_MASTER
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_staging(output, lambda: process.poll() is None)
        process.send_signal(signal.SIGINT)  # the export process only, as `kill -INT` would
        stdout, stderr = process.communicate(timeout=WAIT_DEADLINE_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr[-3000:]
    lines = (stdout + stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), lines
    assert not (output / STATE_DIR_NAME / "staging").exists()


README = TESTS_DIR.parents[1] / "README.md"
README_SPARK_BLOCK = "```python\nfrom spark.datasource import register"


def test_the_readme_spark_block_runs_and_its_stream_has_finished_when_it_returns(
    cluster: LocalCluster, session: SparkSession, tmp_path: Path
) -> None:
    """README's Spark block, run as written with its named placeholders given this cluster's
    values: the availableNow stream has written every committed row when the block returns
    (it awaits termination; issue 31)."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index(README_SPARK_BLOCK) + len("```python\n") :]
    block = block[: block.index("```")]
    placeholders = {
        "ZOOKEEPER": cluster.zookeeper,
        "CLUSTER_ROOT": cluster.cluster_root,
        "CLIENT_CONFIG": str(cluster.client_config_path),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    # The placeholders are named as such, on the block's own lines: replace those lines.
    assert "# Placeholders:" in block
    ours = [line for line in block.splitlines() if line.startswith(tuple(placeholders))]
    assert all(name in " ".join(ours) for name in placeholders), ours
    code = "".join(f"{name} = {value!r}\n" for name, value in placeholders.items())
    code += "\n".join(line for line in block.splitlines() if line not in ours)
    append(cluster, {p: [f"p{p}-readme-{i}" for i in range(3)] for p in PARTITIONS})
    exec(compile(code, "README.md", "exec"), {"spark": session})  # noqa: S102 - the README's code
    written = session.read.schema(SPARK_SCHEMA).parquet(placeholders["OUTPUT_DIR"])
    assert written.count() == len(tailed(cluster))
