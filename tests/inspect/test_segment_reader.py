"""The read-only segment reader on hand-made damage, and with tiny read buffers."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from inspect_helpers import write_segment

from waltz_engine.common.crc import crc32
from waltz_engine.disk import segment_reader
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.segment_reader import SegmentProblem, SegmentReader, SegmentRecord

PAYLOADS = [bytes([65 + i]) * (i * 7 + 1) for i in range(12)]


def _scan(path: Path, start: int | None = None) -> list[tuple[str, int | None]]:
    with SegmentReader(path) as reader:
        return [
            ("record", item.record.record.transaction_id)
            if isinstance(item, SegmentRecord)
            else (item.kind, item.transaction_id)
            for item in reader.scan(start)
        ]


def _record_offsets(path: Path) -> list[int]:
    with SegmentReader(path) as reader:
        return [item.record.offset for item in reader.scan() if isinstance(item, SegmentRecord)]


def test_tiny_buffers_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seg = write_segment(tmp_path, 500, PAYLOADS)
    normal = _scan(seg), _scan(seg, 507)
    monkeypatch.setattr(segment_reader, "READ_BLOCK_BYTES", 16)
    monkeypatch.setattr(segment_reader, "INDEX_BLOCK_ENTRIES", 3)
    assert (_scan(seg), _scan(seg, 507)) == normal
    assert normal[0] == [("record", 500 + i) for i in range(12)]
    assert normal[1][0] == ("record", 507)


def test_scan_from_a_txid_beyond_the_index_continues_from_its_last_entry(tmp_path: Path) -> None:
    seg = write_segment(tmp_path, 0, PAYLOADS)
    idx = seg.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[: HEADER_SIZE_BYTES + 8 * 5])  # index knows txids 0..4
    assert _scan(seg, 9)[:2] == [("record", 4), ("unindexed-record", 5)]


def test_txid_field_that_does_not_follow(tmp_path: Path) -> None:
    seg = write_segment(tmp_path, 0, PAYLOADS)
    offset = _record_offsets(seg)[3]
    content = bytearray(seg.read_bytes())
    struct.pack_into(">q", content, offset, 99)
    end = offset + 36 + len(PAYLOADS[3])
    struct.pack_into(">i", content, end, crc32(bytes(content[offset:end])))  # checksums still pass
    seg.write_bytes(bytes(content))
    problems = [item for item in _scan(seg) if item[0] != "record"]
    assert problems == [("txid-mismatch", 3)]


def test_negative_data_length_stops_the_walk(tmp_path: Path) -> None:
    seg = write_segment(tmp_path, 0, PAYLOADS)
    offset = _record_offsets(seg)[10]
    content = bytearray(seg.read_bytes())
    struct.pack_into(">i", content, offset + 28, -5)
    seg.write_bytes(bytes(content))
    items = _scan(seg)
    assert items[-1] == ("bad-record-header", 10)
    assert items[:-1] == [("record", i) for i in range(10)]
    with SegmentReader(seg) as reader:
        last = list(reader.scan())[-1]
    assert isinstance(last, SegmentProblem) and "the index lists it and 1 more" in last.message


def test_partial_index_entry_and_index_header_mismatch(tmp_path: Path) -> None:
    seg = write_segment(tmp_path, 0, PAYLOADS[:2])
    other = write_segment(tmp_path / "other", 0, PAYLOADS[:2], partition=1)
    idx = seg.with_suffix(".idx")
    idx.write_bytes(other.with_suffix(".idx").read_bytes() + b"\x00\x01\x02")
    with SegmentReader(seg) as reader:
        kinds = [(p.kind, p.message) for p in reader.header_problems]
    assert ("index-partial-entry", "index ends with 3 bytes of a partial entry (ignored)") in kinds
    assert ("header", "index header partition_id 1 differs from the data header's 0") in kinds


def test_record_larger_than_a_read_block(tmp_path: Path) -> None:
    big = bytes(range(256)) * (segment_reader.READ_BLOCK_BYTES // 256 + 3)
    seg = write_segment(tmp_path, 0, [b"small", big, b"after"])
    with SegmentReader(seg) as reader:
        records = [item.record for item in reader.scan() if isinstance(item, SegmentRecord)]
    assert [r.record.data for r in records] == [b"small", big, b"after"]
    assert all(r.checksum_ok and r.record_checksum_ok for r in records)
