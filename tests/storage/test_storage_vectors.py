"""Our engine against the golden storage directories written by Waltz 0.13.2."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
from storage_testlib import (
    VECTOR_KEY,
    VECTOR_NUM_PARTITIONS,
    VECTOR_THRESHOLD_BYTES,
    copy_writable,
    record_from_vector,
    storage_files,
    without_creation_time,
)
from testkit import read_jsonl

from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.common.record import Record
from waltz_engine.disk.record_run import JoinedRuns, WireRecordRun
from waltz_engine.storage import SessionInfo, StorageManager
from waltz_engine.storage.segment import CorruptRecordError
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    STORAGE_DATA_PORT_CODEC,
    StorageAppendRequest,
    StorageAppendRunRequest,
)

ALL_PARTITIONS = list(range(VECTOR_NUM_PARTITIONS))
# Run 1 (store session 0) wrote these txids, run 2 (session 1) the rest (README §4).
RUN1_COUNT = {0: 150, 1: 60, 2: 20, 3: 0}


def _open(directory: Path) -> StorageManager:
    return StorageManager(
        directory, VECTOR_KEY, VECTOR_NUM_PARTITIONS, segment_size_threshold_bytes=VECTOR_THRESHOLD_BYTES
    )


def _vector_records(vectors: Path) -> dict[int, list[Record]]:
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for line in read_jsonl(vectors / "disk" / "clean" / "expected.jsonl"):
        by_partition[line["partition"]].append(record_from_vector(line))
    return by_partition


def _assert_same_files(ours: Path, theirs: Path) -> None:
    mine, golden = storage_files(ours), storage_files(theirs)
    assert sorted(mine) == sorted(golden)
    for name, data in golden.items():
        assert without_creation_time(mine[name]) == without_creation_time(data), name


def test_assigning_partitions_writes_the_fresh_directory(tmp_path: Path, vectors: Path) -> None:
    with _open(tmp_path) as manager:
        manager.set_partition_assignment(ALL_PARTITIONS, True)
    _assert_same_files(tmp_path, vectors / "disk" / "fresh" / "storage")


def _as_sent(records: list[Record], form: str) -> Sequence[Record] | WireRecordRun | JoinedRuns:
    """The records as the storage node's data port hands them to the partition: ``wire`` the
    APPEND_REQUEST's record bytes (no ``Record`` each), ``joined`` two requests' grouped."""
    if form == "records":
        return records

    def run(part: list[Record]) -> WireRecordRun:
        frame = STORAGE_CODEC.encode_frame(StorageAppendRequest(0, 0, 0, tuple(part), False))
        msg = STORAGE_DATA_PORT_CODEC.decode(frame[FRAME_HEADER_SIZE_BYTES:])
        assert isinstance(msg, StorageAppendRunRequest) and msg.records.records() == tuple(part)
        return msg.records

    if form == "wire":
        return run(records)
    half = len(records) // 2
    return JoinedRuns([run(records[:half]), run(records[half:])])


@pytest.mark.parametrize(
    ("batch_size", "form"), [(1, "records"), (7, "records"), (1, "wire"), (7, "wire"), (7, "joined")]
)
def test_replaying_the_workload_writes_the_clean_directory(
    tmp_path: Path, vectors: Path, batch_size: int, form: str
) -> None:
    records = _vector_records(vectors)
    with _open(tmp_path) as manager:
        manager.set_partition_assignment(ALL_PARTITIONS, True)
        for session_id, runs in ((0, "run1"), (1, "run2")):
            for p in ALL_PARTITIONS:
                partition = manager.partition(p)
                partition.set_low_water_mark(session_id, partition.max_transaction_id())
                todo = records[p][: RUN1_COUNT[p]] if runs == "run1" else records[p][RUN1_COUNT[p] :]
                for i in range(0, len(todo), batch_size):
                    partition.append(_as_sent(todo[i : i + batch_size], form))
    _assert_same_files(tmp_path, vectors / "disk" / "clean" / "storage")


def test_reads_return_every_stored_record(tmp_path: Path, vectors: Path) -> None:
    expected = _vector_records(vectors)
    directory = copy_writable(vectors / "disk" / "clean" / "storage", tmp_path / "storage")
    with StorageManager(directory, VECTOR_KEY, VECTOR_NUM_PARTITIONS, segment_cache_capacity=2) as manager:
        assert manager.assigned_partition_ids() == ALL_PARTITIONS
        for p in ALL_PARTITIONS:
            partition = manager.partition(p)
            want = expected[p]
            assert partition.max_transaction_id() == len(want) - 1
            assert partition.records(0, 1000) == want
            assert partition.record_headers(0, 1000) == [r.record_header() for r in want]
            for r in reversed(want):  # one by one, backwards: every segment through the LRU
                assert partition.record(r.transaction_id) == r
                assert partition.record_header(r.transaction_id) == r.record_header()
            assert partition.record(len(want)) is None
            assert partition.record(-1) is None
            assert partition.records(len(want) - 2, 10) == want[-2:]
        assert manager.partition(0).last_session_info() == SessionInfo(1, 149, 149)
        assert manager.partition(3).last_session_info() == SessionInfo(1, -1, -1)
    assert storage_files(directory) == storage_files(vectors / "disk" / "clean" / "storage")


def test_recovery_of_the_damaged_directory(tmp_path: Path, vectors: Path) -> None:
    damaged = vectors / "disk" / "damaged"
    clean = storage_files(vectors / "disk" / "clean" / "storage")
    before = storage_files(damaged / "storage")
    directory = copy_writable(damaged / "storage", tmp_path / "storage")
    with _open(directory) as manager:
        p0 = manager.partition(0)
        assert p0.max_transaction_id() == 178
        assert p0.record(179) is None
        # Record 10 is rotten (kept on disk, not "repaired"): never served, the error names it.
        with pytest.raises(CorruptRecordError, match="partition 0 transaction 10: record checksum mismatch"):
            p0.record(10)
        assert p0.records(0, 20) == _vector_records(vectors)[0][:10]  # the good ones before it
        assert p0.records(11, 2) == _vector_records(vectors)[0][11:13]
        assert manager.partition(2).max_transaction_id() == 24
        # Partition 1's current struct is broken: it falls back to struct 2 (session 0).
        assert manager.partition(1).last_session_info() == SessionInfo(0, -1, -1)
    after = storage_files(directory)

    summary = json.loads((damaged / "recovery-summary.json").read_text())
    for change in summary:
        name = change["file"]
        assert len(after[name]) == change["after_recovery_size"], name
        assert (after[name] == clean[name]) == change["after_recovery_equals_clean"], name
        assert (after[name] == before[name]) == change["after_recovery_equals_damaged"], name
        assert clean[name].startswith(after[name]) == change["after_recovery_is_prefix_of_clean"], name
    changed = {name for name in before if after[name] != before[name]}
    assert changed == {c["file"] for c in summary if not c["after_recovery_equals_damaged"]}
    for line in read_jsonl(damaged / "diskcli" / "commands.jsonl"):
        for change in line["files_changed_by_command"]:
            assert len(after[change["file"]]) == change["size_after"], line["command"]


def test_both_structs_corrupted_is_refused(tmp_path: Path, vectors: Path) -> None:
    directory = copy_writable(vectors / "disk" / "damaged-control-both" / "storage", tmp_path / "storage")
    with pytest.raises(FormatError, match="partition info corrupted"):
        _open(directory)


def test_key_and_partition_count_must_match(tmp_path: Path, vectors: Path) -> None:
    directory = copy_writable(vectors / "disk" / "fresh" / "storage", tmp_path / "storage")
    with pytest.raises(StorageError, match="the cluster key does not match"):
        StorageManager(directory, uuid.uuid4(), VECTOR_NUM_PARTITIONS)
    with pytest.raises(StorageError, match="the number of partitions does not match"):
        StorageManager(directory, VECTOR_KEY, VECTOR_NUM_PARTITIONS + 1)
    with _open(directory) as manager:  # the failed opens released the lock
        with pytest.raises(StorageError, match="inconsistent with key"):
            manager.open(uuid.uuid4(), VECTOR_NUM_PARTITIONS)
        manager.open(VECTOR_KEY, VECTOR_NUM_PARTITIONS)
