"""Start-up recovery of the last segment against damage that looks like something else (issue 13,
item 2, review): an index grown past the data, a client payload holding a record's bytes, a
damaged checkpoint entry; and what damage costs to hold (ranges, never one entry per record).

One segment per partition here (a large threshold), so the last segment is the whole log.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from storage_support import open_one_partition, overwrite

from waltz_engine.common.crc import crc32
from waltz_engine.common.fileio import pread_upto
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import (
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
    encode_records,
)
from waltz_engine.storage import StorageManager, segment, segment_scan
from waltz_engine.storage.damage import MAX_DAMAGE_RANGES_PER_SEGMENT, Damage, DamageLog
from waltz_engine.storage.segment import CorruptRecordError

KEY = uuid.UUID("0e5c7d1a-2b3f-4a6e-9d8c-7f1e2d3c4b5a")
DATA_BYTES = 24
RECORD_BYTES = RECORD_OVERHEAD_BYTES + DATA_BYTES
SEG = "0000000000000000000.seg"
IDX = "0000000000000000000.idx"


def _record(txid: int, data: bytes | None = None) -> Record:
    data = txid.to_bytes(8, "big") * (DATA_BYTES // 8) if data is None else data
    return Record(txid, ReqId(3, 1, 0, txid), txid, data, crc32(data))


def _open(directory: Path) -> StorageManager:
    return open_one_partition(directory, KEY)


def _write(directory: Path, records: list[Record], low_water_mark: int = -1) -> None:
    with _open(directory) as manager:
        partition = manager.partition(0)
        partition.append(records[: low_water_mark + 1])
        partition.set_low_water_mark(1, low_water_mark)
        partition.append(records[low_water_mark + 1 :])


def _path(directory: Path, name: str) -> Path:
    return directory / "0" / name


def _index_entry(directory: Path, txid: int) -> int:
    raw = _path(directory, IDX).read_bytes()
    return int(INDEX_ENTRY.unpack_from(raw, HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * txid)[0])


def _holding(txid: int, inner: Record) -> Record:
    """Record ``txid`` whose payload (client bytes) is a whole encoded record ``inner``."""
    data, _ = encode_records([inner], 0)
    return _record(txid, data + b"\0" * DATA_BYTES)


def test_an_index_grown_past_the_data_proves_no_checkpoint(tmp_path: Path) -> None:
    """A crash grew the index with zeros (ten checkpoints' worth) and tore the last record: the
    checkpoint its size implies is not where any record is, so it proves nothing. The torn record
    is cut as the original cuts a tail; no transaction is claimed past the last one found."""
    records = [_record(t) for t in range(2500)]
    _write(tmp_path, records)
    seg, idx = _path(tmp_path, SEG), _path(tmp_path, IDX)
    os.truncate(seg, seg.stat().st_size - 3)
    os.truncate(idx, idx.stat().st_size + INDEX_ENTRY_SIZE_BYTES * 10_000)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == 2498
        assert partition.damage_report() == []
        assert partition.records(2490, 100) == records[2490:2499]
        partition.append([records[2499]])
    assert idx.stat().st_size == HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * 2500


def test_a_durable_record_is_stepped_over_by_its_own_length_never_into_its_payload(tmp_path: Path) -> None:
    """Record 12 is durable and damaged, its payload holds a whole record 13 (a client's bytes) and
    the index entries from 12 on were lost: the walk goes on where 12's own length ends it."""
    fake = _record(13, b"f" * DATA_BYTES)
    records = [_record(t) for t in range(15)]
    records[12] = _holding(12, fake)
    _write(tmp_path, records, low_water_mark=14)
    seg, idx = _path(tmp_path, SEG), _path(tmp_path, IDX)
    twelve = _index_entry(tmp_path, 12)
    overwrite(seg, twelve + RECORD_OVERHEAD_BYTES - 5, b"\xff")  # the last data byte, after the copy
    overwrite(idx, HEADER_SIZE_BYTES + 12 * INDEX_ENTRY_SIZE_BYTES, bytes(3 * INDEX_ENTRY_SIZE_BYTES))
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == 14
        assert [(d.segment, d.transactions) for d in partition.damage_report()] == [(0, ((12, 12),))]
        with pytest.raises(CorruptRecordError):
            partition.record(12)
        assert partition.records(13, 10) == records[13:]


def test_a_damaged_checkpoint_entry_is_walked_back_to_in_bounded_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open reads the checkpoint's entry first, and the index only in bounded chunks after it:
    never the whole index of a large last segment."""
    records = [_record(t, b"r") for t in range(10_000)]
    _write(tmp_path, records)
    asked: list[int] = []
    real = segment_scan.read_index

    def spy(idx_fd: int, first: int, from_txid: int, count: int) -> list[int]:
        asked.append(count)
        return real(idx_fd, first, from_txid, count)

    monkeypatch.setattr(segment_scan, "read_index", spy)
    with _open(tmp_path) as manager:
        assert manager.partition(0).max_transaction_id() == 9999
    assert asked == [1]
    overwrite(
        _path(tmp_path, IDX), HEADER_SIZE_BYTES + 9000 * INDEX_ENTRY_SIZE_BYTES, bytes(INDEX_ENTRY_SIZE_BYTES)
    )
    asked.clear()
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == 9999
        assert partition.damage_report() == []  # 8999 is whole: the walk rebuilt 9000's entry
    assert 0 < max(asked) <= segment_scan.INDEX_CHUNK_ENTRIES
    assert _index_entry(tmp_path, 9000) == HEADER_SIZE_BYTES + 9000 * (RECORD_OVERHEAD_BYTES + 1)


def test_a_truncate_never_trusts_a_later_entry_over_the_record_itself(tmp_path: Path) -> None:
    """Entry 8 damaged to point inside record 7's payload, at a whole record 8 a client wrote
    there: the truncate keeping 7 cuts where 7 ends, not there."""
    fake = _record(8, b"f" * DATA_BYTES)
    records = [_record(t) for t in range(10)]
    records[7] = _holding(7, fake)
    _write(tmp_path, records, low_water_mark=9)  # the open checks record 9 only: entry 8 stays
    inside = _index_entry(tmp_path, 7) + RECORD_OVERHEAD_BYTES - 4
    overwrite(_path(tmp_path, IDX), HEADER_SIZE_BYTES + 8 * INDEX_ENTRY_SIZE_BYTES, INDEX_ENTRY.pack(inside))
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.truncate(7) == 7
        assert partition.records(0, 100) == records[:8]


def test_checking_a_record_reads_no_more_than_the_file_holds_in_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [_record(t) for t in range(5)]
    _write(tmp_path, records, low_water_mark=4)
    # Record 4's length says almost 2 GiB.
    overwrite(_path(tmp_path, SEG), _index_entry(tmp_path, 4) + 28, (0x7FFF0000).to_bytes(4, "big"))
    asked: list[int] = []
    real = pread_upto

    def spy(fd: int, size: int, offset: int) -> bytes:
        asked.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(segment_scan, "pread_upto", spy)
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id() == 4
        assert [(d.segment, d.transactions) for d in partition.damage_report()] == [(0, ((4, 4),))]
    assert max(asked) <= segment_scan.CHECK_CHUNK_BYTES


def test_a_read_loads_a_bounded_span(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [_record(t) for t in range(20)]
    _write(tmp_path, records)
    monkeypatch.setattr(segment, "MAX_READ_SPAN_BYTES", 3 * RECORD_BYTES)
    asked: list[int] = []
    real = pread_upto

    def spy(fd: int, size: int, offset: int) -> bytes:
        asked.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(segment, "pread_upto", spy)
    with _open(tmp_path) as manager:
        assert manager.partition(0).records(0, 100) == records
    assert max(asked) <= 3 * RECORD_BYTES


def test_damage_is_held_as_merged_capped_ranges() -> None:
    log = DamageLog()
    log.add(0, [Damage("not in the index", 0, 999_999)])
    assert log.add_found_on_read(0, 5, "record checksum mismatch") is False  # known already
    assert log.add_found_on_read(0, 2_000_000, "record checksum mismatch") is True
    log.add(7, [Damage("cannot be located", t, t) for t in range(0, 20_000, 2)])
    log.add(7, [Damage("cannot be located", 1, 1)])
    (first, second) = log.report(lambda segment: segment + 3_000_000)
    assert first.transactions == ((0, 999_999), (2_000_000, 2_000_000))
    assert first.problems == ("not in the index", "record checksum mismatch")
    assert len(second.transactions) <= MAX_DAMAGE_RANGES_PER_SEGMENT
    assert second.transactions[0][0] == 0 and second.transactions[-1][1] == 19_998
    log.forget_after(100)
    assert log.report(lambda segment: 100)[0].transactions == ((0, 100),)
