"""The `waltz` data source over real storage directories (the golden vectors and copies of them)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql import SparkSession
from spark_support import local_spark_session, run_spark_cli, writable_clean_storage

from spark import commit
from spark.datasource import admit
from spark.export import ExportConfig, run_export
from spark.plan import OPTION_ON_CORRUPT, OPTION_PATH, OPTION_TO_TXID, OptionsError, ReadOptions
from spark.schema import SPARK_SCHEMA
from spark.segments import CorruptRecordError
from spark.watermarks import load_file_watermarks
from spark.worker_daemon import PYSPARK_ZIP_NAME, without_pyspark_zip
from waltz_engine.zk.export_watermarks import decode_export_watermarks, encode_export_watermarks

BEYOND_EVERY_TXID = "1000000"
EXPECTED_ROWS = 279
# Bounds the wait for a streaming query to finish (never asserted on as a duration).
STREAM_DEADLINE_S = 180


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    with local_spark_session() as spark:
        yield spark


@pytest.fixture
def storage(vectors: Path, tmp_path: Path) -> Path:
    return writable_clean_storage(vectors, tmp_path)


def expected_rows(vectors: Path) -> list[dict[str, Any]]:
    rows = [
        json.loads(line) for line in (vectors / "disk" / "clean" / "expected.jsonl").read_text().splitlines()
    ]
    return [
        {
            "partition": r["partition"],
            "transaction_id": r["transactionId"],
            "client_id": r["reqId"]["clientId"],
            "generation": r["reqId"]["generation"],
            "seq_num": r["reqId"]["seqNum"],
            "header": r["header"],
            "data": bytes.fromhex(r["data_hex"]),
            "checksum": r["checksum"],
        }
        for r in rows
    ]


def read(session: SparkSession, **options: str) -> list[dict[str, Any]]:
    df = session.read.format("waltz").options(**options).load()
    rows = [r.asDict() for r in df.collect()]
    for row in rows:
        row["data"] = bytes(row["data"])
    return sorted(rows, key=lambda r: (r["partition"], r["transaction_id"]))


def test_reads_every_row_of_the_golden_vectors(session: SparkSession, vectors: Path) -> None:
    df = (
        session.read.format("waltz")
        .options(path=str(vectors / "disk/clean/storage"), to_txid=BEYOND_EVERY_TXID)
        .load()
    )
    assert df.schema == SPARK_SCHEMA  # names, types and NOT NULL
    assert df.rdd.getNumPartitions() == 9  # one per segment
    rows = read(session, path=str(vectors / "disk/clean/storage"), to_txid=BEYOND_EVERY_TXID)
    assert len(rows) == EXPECTED_ROWS
    assert rows == expected_rows(vectors)


def test_without_a_cluster_the_bound_must_be_given_not_the_low_water_mark(storage: Path) -> None:
    # It used to stop silently at the control files' low-water marks (149, 59, 19 here).
    with pytest.raises(OptionsError, match="committed bound is unknown"):
        ReadOptions.parse({"path": str(storage)})


def test_a_source_error_names_the_waltz_message_on_its_first_line(
    session: SparkSession, storage: Path
) -> None:
    """`register` hides Python workers' tracebacks unless the session sets it (issue 31)."""
    with pytest.raises(Exception) as failure:  # noqa: PT011 - Spark's own exception class
        read(session, path=str(storage), partiton="1")
    first = str(failure.value).splitlines()[0]
    assert "spark.plan.OptionsError: unknown option(s) partiton" in first, str(failure.value)


def test_unknown_options_are_rejected_with_the_known_ones(storage: Path) -> None:
    with pytest.raises(OptionsError, match=r"unknown option\(s\) partiton: .*\bpartitions\b"):
        ReadOptions.parse({"path": str(storage), "to_txid": "1", "partiton": "2"})
    # Spark passes names lower-cased; a cluster is enough, no directory needed.
    parsed = ReadOptions.parse(
        {"zookeeper": "127.0.0.1:2181", "cluster.root": "/c", "ssl.truststore.type": "PEM"}
    )
    assert parsed.over_network and parsed.cluster is not None
    assert parsed.cluster.tls.trust_store_type == "PEM"


def test_an_empty_range_is_an_empty_dataframe(session: SparkSession, storage: Path) -> None:
    # It failed with PythonException: AssertionError.
    assert read(session, path=str(storage), from_txid=BEYOND_EVERY_TXID, to_txid=BEYOND_EVERY_TXID) == []
    assert read(session, path=str(storage), partitions="0", from_txid="10", to_txid="5") == []


def test_filters_on_partition_and_txid_are_pushed_down(session: SparkSession, storage: Path) -> None:
    df = session.read.format("waltz").options(path=str(storage), to_txid=BEYOND_EVERY_TXID).load()
    narrow = df.filter("partition = 2 AND transaction_id > 15")
    assert narrow.rdd.getNumPartitions() == 1  # one slice of partition 2, not every segment
    assert [(r.partition, r.transaction_id) for r in narrow.collect()] == [(2, t) for t in range(16, 25)]
    some = df.filter("partition IN (0, 2) AND transaction_id BETWEEN 3 AND 4")
    assert sorted((r.partition, r.transaction_id) for r in some.collect()) == [(0, 3), (0, 4), (2, 3), (2, 4)]
    assert df.filter("partition = 77").count() == 0


def test_range_and_partitions_options(session: SparkSession, storage: Path) -> None:
    rows = read(session, path=str(storage), partitions="0-1", from_txid="40", to_txid="45")
    assert [(r["partition"], r["transaction_id"]) for r in rows] == [
        (p, t) for p in (0, 1) for t in range(40, 46)
    ]


def test_reads_each_partition_from_one_replica(session: SparkSession, storage: Path, tmp_path: Path) -> None:
    lagging = tmp_path / "lagging"
    shutil.copytree(storage, lagging)
    for segment in (lagging / "0").glob("0000000000000000167.*"):
        segment.unlink()  # this copy of partition 0 ends at 166
    rows = read(session, paths=f"{lagging},{storage}", to_txid=BEYOND_EVERY_TXID)
    keys = [(r["partition"], r["transaction_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == EXPECTED_ROWS  # no duplicates, the fuller copy chosen


def test_first_segment_need_not_start_at_zero(session: SparkSession, storage: Path) -> None:
    for segment in (storage / "0").glob("0000000000000000000.*"):
        segment.unlink()  # as retention does
    rows = read(session, path=str(storage), partitions="0", to_txid=BEYOND_EVERY_TXID)
    assert [r["transaction_id"] for r in rows] == list(range(42, 180))


def _corrupt_record(storage: Path) -> None:
    segment = storage / "1" / "0000000000000000000.seg"
    content = bytearray(segment.read_bytes())
    # The data of txid 0 of partition 1 (after the 128-byte header and a 36-byte record header).
    content[128 + 36] ^= 0xFF
    segment.write_bytes(bytes(content))


def test_corrupt_record_fails_or_is_skipped(session: SparkSession, storage: Path) -> None:
    _corrupt_record(storage)
    with pytest.raises(Exception, match="checksum mismatch") as failure:
        read(session, path=str(storage), partitions="1", to_txid=BEYOND_EVERY_TXID)
    assert "transaction 0" in str(failure.value)
    # The source's own message follows Spark's one framing line, with no traceback (issue 31).
    lines = str(failure.value).splitlines()
    assert lines[1].startswith("spark.segments.CorruptRecordError: "), lines
    assert "Traceback" not in str(failure.value)
    rows = read(session, path=str(storage), partitions="1", to_txid=BEYOND_EVERY_TXID, on_corrupt="skip")
    assert [r["transaction_id"] for r in rows] == list(range(1, 70))


def test_segment_reader_fallback_on_a_damaged_index(storage: Path) -> None:
    from spark.segments import SegmentSlice, read_slice

    index = storage / "0" / "0000000000000000000.idx"
    content = bytearray(index.read_bytes())
    content[128 + 8 * 5 : 128 + 8 * 6] = (999).to_bytes(8, "big")  # txid 5 points nowhere
    index.write_bytes(bytes(content))
    part = SegmentSlice(0, str(storage / "0" / "0000000000000000000.seg"), 0, 0, 41)
    txids = [t for batch in read_slice(part) for t in batch.column("transaction_id").to_pylist()]
    assert txids == list(range(42))
    _corrupt_record(storage)
    with pytest.raises(CorruptRecordError):
        list(read_slice(SegmentSlice(1, str(storage / "1" / "0000000000000000000.seg"), 0, 0, 41)))


def test_watermark_payload_is_data_output_stream_bytes() -> None:
    encoded = encode_export_watermarks({3: 7, 0: -1})
    assert encoded.hex() == "010000000200000000ffffffffffffffff000000030000000000000007"
    assert decode_export_watermarks(encoded) == {0: -1, 3: 7}


def test_a_run_killed_after_its_commit_point_is_finished_by_the_next(tmp_path: Path) -> None:
    output = tmp_path / "out"
    staged = commit.staging_dir(output) / "partition=0" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    pending = commit.prepare(output, ["partition=0/part-0.parquet"], {0: 41})
    # Killed after moving the file but before the watermark: the next run completes it once.
    (output / "partition=0").mkdir()
    staged.replace(output / "partition=0" / "part-0.parquet")
    assert pending.files == ("partition=0/part-0.parquet",)
    assert commit.recover(output) is True
    assert load_file_watermarks(output) == {0: 41}
    assert (output / "partition=0" / "part-0.parquet").read_bytes() == b"rows"
    assert not commit.staging_dir(output).exists()


def test_a_committed_run_missing_a_file_is_an_error_not_a_silent_gap(tmp_path: Path) -> None:
    output = tmp_path / "out"
    staged = commit.staging_dir(output) / "partition=0" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    commit.prepare(output, ["partition=0/part-0.parquet"], {0: 41})
    staged.unlink()  # lost after the commit point (say, a disk replaced by a backup)
    with pytest.raises(commit.CommitError, match="neither staged nor exported"):
        commit.recover(output)
    assert load_file_watermarks(output) == {}  # the watermark never moved past the missing rows


def test_a_run_killed_before_its_commit_point_leaves_nothing(tmp_path: Path) -> None:
    output = tmp_path / "out"
    staged = commit.staging_dir(output) / "partition=0" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    assert commit.recover(output) is False
    assert not commit.staging_dir(output).exists()
    assert load_file_watermarks(output) == {}
    assert not (output / "partition=0").exists()


def test_admit_shares_the_limit_evenly_and_always_makes_progress() -> None:
    start = {"0": -1, "1": 9, "2": 99}
    available = {"0": 149, "1": 59, "2": 119}  # new: 150, 50, 20
    assert admit(start, available, 60) == {"0": 19, "1": 29, "2": 119}  # 20 (all of p2), 20, 20
    assert admit(start, available, 1_000) == available
    assert admit(start, available, 1) == {"0": -1, "1": 9, "2": 100}  # one row, never none
    assert admit(start, {"0": -1, "1": 9, "2": 99}, 5) == start  # nothing new: nothing moves
    # A partition found after the stream started joins from its beginning.
    assert admit({"0": 3}, {"0": 3, "7": 4}, 2) == {"0": 3, "7": 1}


def test_max_rows_per_trigger_must_be_a_positive_count() -> None:
    for bad in ("0", "-5", "ten"):
        with pytest.raises(OptionsError, match="max_rows_per_trigger"):
            ReadOptions.parse({"path": "/data", "to_txid": "1", "max_rows_per_trigger": bad})


def test_stream_available_now_reads_all_committed_in_limited_micro_batches(
    session: SparkSession, storage: Path, vectors: Path, tmp_path: Path
) -> None:
    limit = 50
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = (
        session.readStream.format("waltz")
        .options(path=str(storage), to_txid=BEYOND_EVERY_TXID, max_rows_per_trigger=str(limit))
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(STREAM_DEADLINE_S), "an availableNow query stops by itself"
    assert query.exception() is None
    sizes = [progress["numInputRows"] for progress in query.recentProgress]
    committed = EXPECTED_ROWS
    assert sum(sizes) == committed
    assert max(sizes) == limit and len(sizes) >= -(-committed // limit)
    found = session.read.schema(SPARK_SCHEMA).parquet(str(sink)).select("partition", "transaction_id")
    assert sorted((r.partition, r.transaction_id) for r in found.collect()) == [
        (r["partition"], r["transaction_id"]) for r in expected_rows(vectors)
    ]


def test_local_workers_import_the_installed_pyspark_not_the_zip(session: SparkSession) -> None:
    def where(_: int) -> str:
        import pyspark

        return str(pyspark.__file__)

    locations = session.sparkContext.parallelize([0, 1], 2).map(where).collect()
    assert all(PYSPARK_ZIP_NAME not in location for location in locations), locations


def test_the_zip_stays_when_no_installed_pyspark_is_found(tmp_path: Path) -> None:
    zip_path = str(tmp_path / "lib" / PYSPARK_ZIP_NAME)
    assert without_pyspark_zip([zip_path, str(tmp_path)]) == [zip_path, str(tmp_path)]
    installed = str(Path(pyspark.__file__).parent.parent)
    assert without_pyspark_zip([zip_path, installed]) == [installed]


def test_small_index_windows_and_chunks_read_the_same_rows(
    storage: Path, vectors: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark import segments
    from spark.plan import OPTION_PATHS, OPTION_TO_TXID, plan

    options = ReadOptions.parse({OPTION_PATHS: str(storage), OPTION_TO_TXID: BEYOND_EVERY_TXID})
    parts = [s for p in plan(options) for s in p.slices]
    # Windows and chunks of a few records: every boundary case of the loop, on real segments.
    monkeypatch.setattr(segments, "INDEX_WINDOW_ENTRIES", 7)
    monkeypatch.setattr(segments, "CHUNK_BYTES", 300)
    rows = [row for part in parts for batch in segments.read_slice(part) for row in batch.to_pylist()]
    assert sorted(rows, key=lambda r: (r["partition"], r["transaction_id"])) == expected_rows(vectors)


def test_export_of_a_corrupt_log_fails_with_one_line_and_commits_nothing(
    session: SparkSession, storage: Path, tmp_path: Path
) -> None:
    _corrupt_record(storage)
    output = tmp_path / "export"
    bound = ("--to-txid", BEYOND_EVERY_TXID)
    result = run_spark_cli("export", "--output", str(output), "--master", "local[2]", *bound, str(storage))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "partition 1 transaction 0" in errors[0] and "checksum mismatch" in errors[0]
    assert "--on-corrupt skip" in errors[0]
    assert load_file_watermarks(output) == {} and not list(output.glob("partition=*"))
    # The same export told to skip it, in this process (a second JVM costs ~12 s of CPU).
    options = {OPTION_PATH: str(storage), OPTION_TO_TXID: BEYOND_EVERY_TXID, OPTION_ON_CORRUPT: "skip"}
    skipped = run_export(session, ExportConfig(output=output, read_options=options))
    assert skipped.rows == EXPECTED_ROWS - 1
