"""Retention in the storage engine: the cleaner's decision, removing head segments on real
files, reads and truncation below the retained start, reopening, and starting an empty log late."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.ops.inspect import verify
from waltz_engine.storage import StorageManager
from waltz_engine.storage.partition import Partition
from waltz_engine.zk.export_watermarks import decode_export_watermarks
from waltz_engine.zk.java_io import DataWriter, JavaFormatError
from waltz_engine.zk.retention import (
    BelowRetainedStartError,
    NodeBounds,
    clear_retention_bound,
    decode_retention_bound,
    effective_bound,
    encode_retention_bound,
    read_highest_bounds,
    read_node_bounds,
    removable_head_segments,
    retained_start_in,
    retention_highest_path,
    set_retention_bound,
)

KEY = uuid.UUID("6a0f3c2e-51b4-4f0e-9d2c-7b8e1a4c5d36")
DATA_BYTES = 60
RECORDS_PER_SEGMENT = 10
# A segment rolls over after the record that takes it past the threshold: 10 records each.
THRESHOLD_BYTES = 128 + (RECORD_OVERHEAD_BYTES + DATA_BYTES) * RECORDS_PER_SEGMENT - 1
SESSION_ID = 7


def _record(transaction_id: int) -> Record:
    data = bytes([transaction_id % 256]) * DATA_BYTES
    return Record(transaction_id, ReqId(1, 1, 0, transaction_id), transaction_id, data, crc32(data))


def _records(first: int, count: int) -> list[Record]:
    return [_record(t) for t in range(first, first + count)]


def _manager(directory: Path) -> StorageManager:
    manager = StorageManager(directory, KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES)
    if not manager.assigned_partition_ids():
        manager.set_partition_assignment([0], True)
    return manager


def _filled(directory: Path, count: int) -> StorageManager:
    """``count`` records, all known committed: a session started after them (local low-water
    mark = the max txid then)."""
    manager = _manager(directory)
    partition = manager.partition(0)
    partition.append(_records(0, count))
    partition.set_low_water_mark(SESSION_ID, count - 1)
    return manager


def _segment_files(partition: Partition) -> list[str]:
    return sorted(p.name for p in partition.directory.iterdir())


def test_decision_keeps_the_current_segment_and_uncommitted_data() -> None:
    spans = [(0, 9), (10, 19), (20, 29), (30, 34)]
    assert removable_head_segments(spans, bound=20, local_low_water_mark=100) == 2
    assert removable_head_segments(spans, bound=19, local_low_water_mark=100) == 1  # 19 is kept
    assert removable_head_segments(spans, bound=1000, local_low_water_mark=100) == 3  # not the last
    assert removable_head_segments(spans, bound=1000, local_low_water_mark=18) == 1  # 19 not committed
    assert removable_head_segments(spans, bound=0, local_low_water_mark=100) == 0
    assert removable_head_segments(spans[-1:], bound=1000, local_low_water_mark=100) == 0


def test_effective_bound_is_lowered_to_every_export() -> None:
    assert effective_bound(None, [5]) is None
    assert effective_bound(100, []) == 100
    assert effective_bound(100, [40, 70]) == 41
    assert effective_bound(100, [500]) == 100


def test_payload_codecs() -> None:
    assert encode_retention_bound(12345) == bytes([1]) + (12345).to_bytes(8, "big")
    assert decode_retention_bound(encode_retention_bound(2**40)) == 2**40
    with pytest.raises(JavaFormatError):
        decode_retention_bound(bytes([2]) + bytes(8))
    export = DataWriter().write_int8(1).write_int32(2).write_int32(0).write_int64(41)
    export.write_int32(3).write_int64(-1)
    assert decode_export_watermarks(export.to_bytes()) == {0: 41, 3: -1}
    with pytest.raises(JavaFormatError):
        decode_export_watermarks(export.to_bytes() + b"x")


def test_removal_reads_reopen_and_verify(tmp_path: Path) -> None:
    directory = tmp_path / "storage"
    directory.mkdir()
    manager = _filled(directory, 35)
    partition = manager.partition(0)
    assert partition.segments == [(0, 9), (10, 19), (20, 29), (30, 34)]

    assert partition.remove_head_segments(25) == [(0, 9), (10, 19)]
    assert _segment_files(partition) == [f"{t:019d}.{suffix}" for t in (20, 30) for suffix in ("idx", "seg")]
    assert partition.first_transaction_id() == 20
    assert partition.remove_head_segments(25) == []  # nothing more is eligible

    with pytest.raises(BelowRetainedStartError) as below:
        partition.records(19, 5)
    assert retained_start_in(str(below.value)) == 20
    with pytest.raises(BelowRetainedStartError):
        partition.record_headers(0, 1)
    assert [r.transaction_id for r in partition.records(20, 3)] == [20, 21, 22]
    manager.close()

    report = verify(directory)
    assert report.ok, report.summary()

    reopened = _manager(directory)
    try:
        partition = reopened.partition(0)
        assert partition.segments == [(20, 29), (30, 34)]
        partition.append(_records(35, 3))
        assert partition.records(34, 10) == _records(34, 4)
    finally:
        reopened.close()


def test_an_index_left_by_a_crash_during_removal_is_cleaned_on_open(tmp_path: Path) -> None:
    directory = tmp_path / "storage"
    directory.mkdir()
    manager = _filled(directory, 25)
    partition_dir = manager.partition(0).directory
    manager.close()
    # The cleaner removes the data file first: a crash right after leaves the index alone.
    (partition_dir / f"{0:019d}.seg").unlink()
    reopened = _manager(directory)
    try:
        assert reopened.partition(0).segments == [(10, 19), (20, 24)]
        assert not (partition_dir / f"{0:019d}.idx").exists()
    finally:
        reopened.close()


def test_uncommitted_records_stay(tmp_path: Path) -> None:
    directory = tmp_path / "storage"
    directory.mkdir()
    manager = _filled(directory, 15)
    partition = manager.partition(0)
    partition.append(_records(15, 20))  # written after the session start: not known committed
    try:
        assert partition.remove_head_segments(1000) == [(0, 9)]
        assert partition.segments[0] == (10, 19)
    finally:
        manager.close()


def test_an_empty_partition_can_start_late_and_reopens(tmp_path: Path) -> None:
    directory = tmp_path / "storage"
    directory.mkdir()
    manager = _manager(directory)
    partition = manager.partition(0)
    assert partition.is_empty()
    partition.start_at(40)
    assert not partition.is_empty()
    with pytest.raises(StorageError):
        partition.start_at(50)
    partition.append(_records(40, 3))
    manager.close()
    reopened = _manager(directory)
    try:
        assert reopened.partition(0).segments == [(40, 42)]
        assert _segment_files(reopened.partition(0)) == [f"{40:019d}.idx", f"{40:019d}.seg"]
    finally:
        reopened.close()


def test_a_dry_run_reads_segment_spans_from_our_nodes_gauges_and_reports_java_nodes_unknown() -> None:
    """`retention set --dry-run` over the network (issue 31): our node's `head-segment-spans`
    gauge gives the spans; a Java 0.13.2 node has none, and its segments are unknown."""
    from waltz_engine.ops.retention_report import removals_from_gauges
    from waltz_engine.storage.node.partition_worker import SEGMENT_SPANS_GAUGE, metric_group

    group = metric_group(0)

    def gauges(spans: list[list[int]], segments: int, local: int) -> dict[str, object]:
        return {
            f"{group}.{SEGMENT_SPANS_GAUGE}": {"value": {"spans": spans, "segments": segments}},
            f"{group}.local-low-water-mark": {"value": local},
        }

    spans = [[0, 9], [10, 19], [20, 29], [30, 34]]
    ours = removals_from_gauges("n1", gauges(spans, 4, 34), 0, 25)
    assert (ours.going, ours.why) == ([(0, 9), (10, 19)], None)
    # The local low-water mark holds back what is not known committed there.
    assert removals_from_gauges("n1", gauges(spans, 4, 12), 0, 25).going == [(0, 9)]
    # Never the newest: with every span listed the last stays; with more segments than listed, not.
    assert removals_from_gauges("n1", gauges(spans, 4, 99), 0, 99).going == [(0, 9), (10, 19), (20, 29)]
    truncated = removals_from_gauges("n1", gauges(spans, 9, 99), 0, 99)
    assert len(truncated.going or []) == 4 and truncated.more
    assert not removals_from_gauges("n1", gauges(spans, 9, 99), 0, 25).more
    java = removals_from_gauges("n2", {f"{group}.local-low-water-mark": {"value": 34}}, 0, 25)
    assert java.going is None and java.why is not None and "Java" in java.why


def test_a_truncate_to_nothing_empties_a_log_whose_head_is_gone(tmp_path: Path) -> None:
    # Its own head removed (20..34 left), it missed 35.. while down, and retention removed up to
    # 39 everywhere else: a server empties it to fill it from the retained start (before, the
    # truncate was refused and every store session failed on it: issue 32). A truncate to a txid
    # below the start is still refused (it would leave a gap).
    directory = tmp_path / "storage"
    directory.mkdir()
    manager = _filled(directory, 35)
    partition = manager.partition(0)
    partition.remove_head_segments(25)
    with pytest.raises(BelowRetainedStartError):
        partition.truncate(5)
    assert partition.segments == [(20, 29), (30, 34)]
    assert partition.truncate(-1) == -1
    assert partition.is_empty() and partition.first_transaction_id() == 0
    assert _segment_files(partition) == [f"{0:019d}.idx", f"{0:019d}.seg"]
    partition.start_at(40)
    partition.append(_records(40, 3))
    manager.close()
    assert verify(directory).ok
    reopened = _manager(directory)
    try:
        assert reopened.partition(0).segments == [(40, 42)]
    finally:
        reopened.close()


def test_the_highest_bound_set_is_kept_for_late_starts(zk_client: Any, cluster_root: str) -> None:
    """A lowered or cleared bound does not bring back what cleaners removed under a higher one:
    an empty replica may still begin its log up to the highest bound ever set (issue 32, the
    simulator's seeds 199, 243 and bank 15, 44 stalled on that refusal)."""
    assert read_node_bounds(zk_client, cluster_root, 2) == NodeBounds({}, {})
    assert set_retention_bound(zk_client, cluster_root, 0, 100) == 100
    assert set_retention_bound(zk_client, cluster_root, 0, 40) == 100  # lowered: the highest stays
    assert set_retention_bound(zk_client, cluster_root, 1, 7) == 7
    assert read_node_bounds(zk_client, cluster_root, 2) == NodeBounds({0: 40, 1: 7}, {0: 100, 1: 7})
    assert clear_retention_bound(zk_client, cluster_root, 0)
    assert read_node_bounds(zk_client, cluster_root, 2) == NodeBounds({1: 7}, {0: 100, 1: 7})
    assert set_retention_bound(zk_client, cluster_root, 0, 120) == 120
    assert read_highest_bounds(zk_client, cluster_root) == {0: 120, 1: 7}
    # A bound set before the highest was recorded (an older node's cluster): the bound stands.
    zk_client.delete(retention_highest_path(cluster_root, 0))
    assert read_node_bounds(zk_client, cluster_root, 2).late_start == {0: 120, 1: 7}
