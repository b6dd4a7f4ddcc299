"""Issue 13, item 2: damage on disk outside the last segment's tail changes no byte and keeps the
partition open; a refill from a healthy replica's records puts the segment back, byte for byte.

A failing disk, flip by flip: a record's data, its header (txid or length), an index entry, a
file header, in a sealed segment and in the middle of the last one; a zeroed run of records.
Start-up recovery may only cut the tail of the last segment (a bad end with nothing whole after
it, above the durable point), as the original does after a crash.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from storage_support import open_one_partition

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import INDEX_ENTRY_SIZE_BYTES, RECORD_OVERHEAD_BYTES
from waltz_engine.ops.inspect import verify
from waltz_engine.storage import Partition, StorageManager
from waltz_engine.storage.refill import refill_path
from waltz_engine.storage.segment import CorruptRecordError

KEY = uuid.UUID("6c1f0a3e-5d2b-4f7a-8e9c-0b1d2e3f4a5b")
DATA_BYTES = 24
RECORD_BYTES = RECORD_OVERHEAD_BYTES + DATA_BYTES
PER_SEGMENT = 5
TOTAL = 15  # segments 0-4, 5-9 (sealed) and 10-14 (the last)
# Offsets inside a record: its txid, its data length, its data.
TXID_AT, LENGTH_AT, DATA_AT = 0, 28, 36


def _records(first: int, count: int) -> list[Record]:
    out = []
    for t in range(first, first + count):
        data = t.to_bytes(8, "big") * (DATA_BYTES // 8)
        out.append(Record(t, ReqId(3, 1, 0, t), t, data, crc32(data)))
    return out


GOOD = _records(0, TOTAL)


def _open(directory: Path) -> StorageManager:
    return open_one_partition(
        directory, KEY, records_per_segment=PER_SEGMENT, record_bytes=RECORD_BYTES, segment_cache_capacity=1
    )


def _write(directory: Path, low_water_mark: int = -1, records: list[Record] = GOOD) -> dict[str, bytes]:
    """The partition's records written (the local low-water mark set first); its files' bytes."""
    with _open(directory) as manager:
        partition = manager.partition(0)
        partition.set_low_water_mark(1, low_water_mark)
        partition.append(records[: low_water_mark + 1])
        if low_water_mark >= 0:
            partition.set_low_water_mark(2, low_water_mark)
        partition.append(records[low_water_mark + 1 :])
        assert partition.segments == [(0, 4), (5, 9), (10, 14)][: len(partition.segments)]
    return _files(directory)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / "0").iterdir())}


def _segment(directory: Path, first: int, suffix: str = ".seg") -> Path:
    return directory / "0" / f"{first:019d}{suffix}"


def _record_offset(txid: int) -> int:
    return HEADER_SIZE_BYTES + (txid % PER_SEGMENT) * RECORD_BYTES


def _flip(path: Path, offset: int, mask: int = 0x10) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ mask]), offset)
    finally:
        os.close(fd)


def _flip_record(directory: Path, txid: int, field: int) -> None:
    _flip(_segment(directory, txid // PER_SEGMENT * PER_SEGMENT), _record_offset(txid) + field)


def _refill(partition: Partition, first: int, last: int, batch: int = 2) -> None:
    for t in range(first, last + 1, batch):
        done = partition.refill(GOOD[t : min(t + batch, last + 1)])
        assert done == (min(t + batch, last + 1) == last + 1)


def _damaged(partition: Partition) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    return [(d.segment, d.transactions) for d in partition.damage_report()]


INDEX_ENTRY_7 = HEADER_SIZE_BYTES + 2 * INDEX_ENTRY_SIZE_BYTES
FLIPS = {
    "record data": lambda d: _flip_record(d, 7, DATA_AT + 5),
    "record txid": lambda d: _flip_record(d, 7, TXID_AT + 7),
    "record length": lambda d: _flip_record(d, 7, LENGTH_AT + 2),
    # Entry 7's low byte (16 bytes off, inside the data); its second byte (4 KiB off, past it).
    "index entry": lambda d: _flip(_segment(d, 5, ".idx"), INDEX_ENTRY_7 + 7),
    "index entry far": lambda d: _flip(_segment(d, 5, ".idx"), INDEX_ENTRY_7 + 6),
}


@pytest.mark.parametrize("where", sorted(FLIPS))
def test_a_flip_in_a_sealed_segment_changes_no_byte_until_the_refill(tmp_path: Path, where: str) -> None:
    clean = _write(tmp_path)
    FLIPS[where](tmp_path)
    flipped = _files(tmp_path)
    with _open(tmp_path) as manager:  # the open that used to cut 8-9 and then refuse 10-14
        partition = manager.partition(0)
        assert _files(tmp_path) == flipped
        assert partition.segments == [(0, 4), (5, 9), (10, 14)]
        assert _damaged(partition) == [(5, ((7, 7),))]
        if where.startswith("index"):
            # Only the derived index is wrong: 7 is whole in the data, right after 6 and right
            # before where 8's entry says, and is served from there (never the entry's bytes).
            assert partition.record(7) == GOOD[7]
            assert partition.records(7, 100) == GOOD[7:]
            assert partition.records(0, 100) == GOOD
        else:
            with pytest.raises(CorruptRecordError, match="partition 0 transaction 7"):
                partition.record(7)
            assert partition.records(0, 100) == GOOD[:7]
        assert partition.records(8, 100) == GOOD[8:]
        assert not verify(tmp_path).ok

        _refill(partition, 5, 9)
        assert _damaged(partition) == []
        assert partition.records(0, 100) == GOOD
        partition.append(_records(TOTAL, 1))  # still the last segment's business
    after = _files(tmp_path)
    assert after["0000000000000000005.seg"] == clean["0000000000000000005.seg"]
    assert after["0000000000000000005.idx"] == clean["0000000000000000005.idx"]
    assert verify(tmp_path).ok


def test_a_segments_first_record_whose_index_entry_rotted_is_served_from_the_data(tmp_path: Path) -> None:
    """Rot in the index entry of a segment's first record (the simulator's seed 1902 of issue 32:
    the one replica still holding a committed record whole refused it, and every recovery
    failed): the record begins at the data's first byte and ends where the next entry says."""
    _write(tmp_path)
    _flip(_segment(tmp_path, 5, ".idx"), HEADER_SIZE_BYTES + 7)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert _damaged(partition) == [(5, ((5, 5),))]
        assert partition.record(5) == GOOD[5]
        assert partition.records(0, 100) == GOOD
        _flip_record(tmp_path, 5, DATA_AT + 5)  # its data rotten too: nothing is served
        with pytest.raises(CorruptRecordError, match="partition 0 transaction 5"):
            partition.record(5)


@pytest.mark.parametrize("suffix", [".seg", ".idx"])
@pytest.mark.parametrize("field", [0, 39])  # the version; the first txid
def test_a_flip_in_a_file_header_is_reported_and_its_records_served(
    tmp_path: Path, suffix: str, field: int
) -> None:
    _write(tmp_path)
    _flip(_segment(tmp_path, 5, suffix), field)
    flipped = _files(tmp_path)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert _files(tmp_path) == flipped
        (report,) = partition.damage_report()
        assert (report.segment, report.transactions) == (5, ())
        assert "header" in report.problems[0], report
        assert partition.records(0, 100) == GOOD  # each record checks out on its own
        _refill(partition, 5, 9, batch=5)
        assert partition.damage_report() == []
    assert verify(tmp_path).ok


def _zero_records(directory: Path, first: int, count: int) -> None:
    fd = os.open(_segment(directory, first // PER_SEGMENT * PER_SEGMENT), os.O_RDWR)
    try:  # gone to zeros, as a dead sector
        os.pwrite(fd, bytes(count * RECORD_BYTES), _record_offset(first))
    finally:
        os.close(fd)


def test_a_zeroed_run_of_durable_records_in_the_last_segment_middle_is_kept(tmp_path: Path) -> None:
    """At or below the durable point: nothing is cut, the run is stepped over through the index,
    and the damaged records' index entries are left as they are."""
    _write(tmp_path, low_water_mark=12)  # the walk starts before 11: 12's entry is not whole
    _zero_records(tmp_path, 11, 2)
    seg, idx = _segment(tmp_path, 10), _segment(tmp_path, 10, ".idx")
    zeroed, index = seg.read_bytes(), idx.read_bytes()
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert seg.read_bytes() == zeroed
        assert idx.read_bytes() == index
        assert partition.max_transaction_id() == TOTAL - 1
        assert _damaged(partition) == [(10, ((11, 12),))]
        assert partition.records(13, 10) == GOOD[13:]
        partition.append(_records(TOTAL, 2))
        assert partition.records(13, 10) == [*GOOD[13:], *_records(TOTAL, 2)]
    with _open(tmp_path) as manager:  # open again: nothing cut; sealed now, checked from 12 on
        partition = manager.partition(0)
        assert _damaged(partition) == [(10, ((12, 12),))]
        with pytest.raises(CorruptRecordError):
            partition.record(11)
        assert _damaged(partition) == [(10, ((11, 12),))]
        assert partition.max_transaction_id() == TOTAL + 1
        assert partition.segments == [(0, 4), (5, 9), (10, 14), (15, 16)]
        _refill(partition, 10, 14, batch=5)
        assert partition.damage_report() == []
        assert partition.records(0, 100) == [*GOOD, *_records(TOTAL, 2)]
    assert verify(tmp_path).ok


def test_a_hole_above_the_durable_point_is_cut_as_the_original_does(tmp_path: Path) -> None:
    """Power loss: record 11's page never landed, later (unacknowledged) ones did. A replica
    keeping 12-14 behind a hole would stall the servers' recovery copying from it."""
    _write(tmp_path)
    _zero_records(tmp_path, 11, 1)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == 10
        assert _damaged(partition) == []
        assert partition.records(0, 100) == GOOD[:11]
    assert _segment(tmp_path, 10).stat().st_size == _record_offset(11)
    assert verify(tmp_path).ok


@pytest.mark.parametrize(("low_water_mark", "kept"), [(-1, 13), (14, 14)])
def test_a_bad_last_record_is_a_tail_unless_it_is_durable(
    tmp_path: Path, low_water_mark: int, kept: int
) -> None:
    """Nothing whole after it: a crash in an append looks the same, so it is cut as the original
    does; but not at or below the local low-water mark, which was synced before it was recorded."""
    _write(tmp_path, low_water_mark)
    _flip_record(tmp_path, 14, DATA_AT)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == kept
        assert _damaged(partition) == ([] if kept == 13 else [(10, ((14, 14),))])


def test_damage_below_the_window_is_found_by_a_read_and_reported(tmp_path: Path) -> None:
    _write(tmp_path, low_water_mark=TOTAL - 1)  # recovery looks at the last record of each segment only
    _flip_record(tmp_path, 2, DATA_AT)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert _damaged(partition) == []
        with pytest.raises(CorruptRecordError):
            partition.record_headers(2, 3)
        assert _damaged(partition) == [(0, ((2, 2),))]
        (report,) = partition.damage_report()
        assert report.max_transaction_id == 4 and "record checksum mismatch" in report.problems


def test_a_refill_that_disagrees_or_skips_replaces_nothing(tmp_path: Path) -> None:
    _write(tmp_path)
    _flip_record(tmp_path, 7, DATA_AT)
    flipped = _files(tmp_path)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        other = GOOD[6]._replace(data=b"x" * DATA_BYTES, checksum=crc32(b"x" * DATA_BYTES))
        with pytest.raises(StorageError, match="transaction 6 held whole here differs"):
            partition.refill([GOOD[5], other])
        with pytest.raises(StorageError, match="starts at transaction 5, not 7"):
            partition.refill(GOOD[7:10])
        with pytest.raises(StorageError, match="stays within one segment"):
            partition.refill(GOOD[5:11])
        assert partition.refill(GOOD[5:7]) is False
        with pytest.raises(StorageError, match="go on at 7, not 8"):
            partition.refill(GOOD[8:10])
        partition.truncate(TOTAL - 1)  # no-op: nothing cut, the copy stays
        partition.append(_records(TOTAL, 1))  # any other write ends the copy
        assert not refill_path(_segment(tmp_path, 5)).exists()
        assert _damaged(partition) == [(5, ((7, 7),))]
    flipped_now = _files(tmp_path)
    for name in ("0000000000000000005.seg", "0000000000000000005.idx"):
        assert flipped_now[name] == flipped[name]


def test_an_interrupted_refill_is_dropped_or_finished_at_open(tmp_path: Path) -> None:
    clean = _write(tmp_path)
    seg, idx = _segment(tmp_path, 5), _segment(tmp_path, 5, ".idx")
    _flip(idx, HEADER_SIZE_BYTES + 3 * INDEX_ENTRY_SIZE_BYTES + 7)
    # Crashed before the swap: both copies there. The segment is as it was; the copies go.
    refill_path(seg).write_bytes(clean[seg.name][:200])
    refill_path(idx).write_bytes(clean[idx.name])
    with _open(tmp_path) as manager:
        assert _damaged(manager.partition(0)) == [(5, ((8, 8),))]
    assert not refill_path(seg).exists() and not refill_path(idx).exists()
    # Crashed between the two renames: the data file is in, its index copy is renamed in too.
    refill_path(idx).write_bytes(clean[idx.name])
    with _open(tmp_path) as manager:
        assert _damaged(manager.partition(0)) == []
    assert _files(tmp_path) == clean


def test_a_truncate_never_cuts_a_damaged_record(tmp_path: Path) -> None:
    _write(tmp_path, low_water_mark=13)
    _flip_record(tmp_path, 12, DATA_AT)
    _flip_record(tmp_path, 13, DATA_AT)
    seg = _segment(tmp_path, 10)
    flipped = seg.read_bytes()
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert _damaged(partition) == [(10, ((12, 13),))]
        # Neither 12's end nor 13's start is proven: the index is cut, not a byte of the data.
        assert partition.truncate(12) == 12
        assert seg.read_bytes() == flipped
        assert _damaged(partition) == [(10, ((12, 12),))]
        assert partition.truncate(11) == 11  # record 11 is whole: cut where it ends
        assert _damaged(partition) == []
        partition.append(GOOD[12:])
        assert partition.records(0, 100) == GOOD
    assert verify(tmp_path).ok


def test_the_last_segment_is_refilled_and_stays_writable(tmp_path: Path) -> None:
    clean = _write(tmp_path, low_water_mark=TOTAL - 1)
    _flip_record(tmp_path, 11, DATA_AT + 1)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        with pytest.raises(CorruptRecordError):
            partition.record(11)  # below the window: found by the read
        _refill(partition, 10, 14, batch=3)
        assert _files(tmp_path) == clean
        partition.append(_records(TOTAL, 1))
        assert partition.records(10, 100) == [*GOOD[10:], *_records(TOTAL, 1)]
        assert partition.damage_report() == []
    assert verify(tmp_path).ok


def _foreign_segment(tmp_path: Path, first: int) -> None:
    """Segment ``first`` replaced by the same segment of another cluster (its own key)."""
    other = tmp_path / "other"
    other.mkdir()
    with StorageManager(
        other, uuid.uuid4(), 1, segment_size_threshold_bytes=HEADER_SIZE_BYTES + 4 * RECORD_BYTES
    ) as m:
        m.set_partition_assignment([0], True)
        m.partition(0).append(
            [r._replace(data=b"B" * DATA_BYTES, checksum=crc32(b"B" * DATA_BYTES)) for r in GOOD]
        )
    for suffix in (".seg", ".idx"):
        _segment(tmp_path, first, suffix).write_bytes(_segment(other, first, suffix).read_bytes())


def test_another_clusters_sealed_segment_is_never_served(tmp_path: Path) -> None:
    clean = _write(tmp_path)
    _foreign_segment(tmp_path, 5)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert _damaged(partition) == [(5, ((5, 9),))]
        assert "another cluster's or partition's segment" in partition.damage_report()[0].problems[-1]
        assert partition.records(0, 100) == GOOD[:5]
        for txid in range(5, 10):
            with pytest.raises(CorruptRecordError, match="cluster key"):
                partition.record(txid)
        assert partition.records(10, 100) == GOOD[10:]
        _refill(partition, 5, 9)
        assert partition.records(0, 100) == GOOD
    assert (
        _segment(tmp_path, 5).read_bytes()[HEADER_SIZE_BYTES:]
        == clean["0000000000000000005.seg"][HEADER_SIZE_BYTES:]
    )


def test_another_clusters_last_segment_refuses_the_open(tmp_path: Path) -> None:
    _write(tmp_path)
    _foreign_segment(tmp_path, 10)
    copied = _files(tmp_path)
    with (
        pytest.raises(
            StorageError, match=r"0000000000000000010\.seg: data file header: cluster key .* move its"
        ),
        _open(tmp_path) as manager,
    ):
        manager.partition(0)
    assert _files(tmp_path) == copied


def test_a_truncate_into_damage_deletes_nothing_it_cannot_finish_and_cuts_no_damaged_record(
    tmp_path: Path,
) -> None:
    """recover-partition truncates to the low-water mark first: damage at it and after it must
    not stop the truncate (the refill that follows needs it), nor cut the damaged record."""
    _write(tmp_path)
    _flip_record(tmp_path, 7, DATA_AT)
    _flip_record(tmp_path, 8, DATA_AT)
    flipped = _segment(tmp_path, 5).read_bytes()
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.truncate(7) == 7
        assert partition.segments == [(0, 4), (5, 7)]
        assert _segment(tmp_path, 5).read_bytes() == flipped  # 8 is not whole: no byte is cut
        with pytest.raises(CorruptRecordError):
            partition.record(7)
        _refill(partition, 5, 7, batch=3)
        partition.append(GOOD[8:])
        assert partition.records(0, 100) == GOOD
        assert partition.damage_report() == []
    assert verify(tmp_path).ok


def test_a_refill_record_must_be_whole(tmp_path: Path) -> None:
    _write(tmp_path)
    _flip_record(tmp_path, 7, DATA_AT)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        with pytest.raises(StorageError, match="transaction 7 sent to refill fails its data checksum"):
            partition.refill([*GOOD[5:7], GOOD[7]._replace(data=b"y" * DATA_BYTES), *GOOD[8:10]])
        assert _damaged(partition) == [(5, ((7, 7),))]


def test_a_refill_interrupted_between_its_renames_is_finished_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = _write(tmp_path)
    _flip_record(tmp_path, 7, DATA_AT)
    renames: list[tuple[Path, Path]] = []

    def rename(source: Path, target: Path) -> None:
        if renames:
            raise OSError("disk gone")
        renames.append((source, target))
        os.replace(source, target)

    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        partition.refill(GOOD[5:8])
        monkeypatch.setattr("waltz_engine.storage.file_system.os.rename", rename)
        with pytest.raises(OSError, match="disk gone"):
            partition.refill(GOOD[8:10])
        with pytest.raises(StorageError, match="closed"):
            partition.append(_records(TOTAL, 1))  # no write may drop the index's copy now
        assert refill_path(_segment(tmp_path, 5, ".idx")).exists()
    monkeypatch.undo()
    with _open(tmp_path) as manager:
        assert _damaged(manager.partition(0)) == []
    assert _files(tmp_path) == clean
