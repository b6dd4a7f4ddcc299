"""RECORD_LIST served from the segments' bytes (``Partition.records_wire``, ``wire_span``): the
same answer, byte for byte, as the record-by-record reader encoded by the wire codec, over
random records (zero-length data, one size and mixed sizes, several segments), and the same
short answers and "corrupt record" refusals when records are damaged."""

from __future__ import annotations

import random
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest
from storage_support import open_one_partition, overwrite

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_columns import (
    LINEAR_CHECK_MIN_RECORDS,
    SMALL_RUN_MAX_RECORDS,
    disk_to_wire,
    unshift_crcs,
)
from waltz_engine.disk.record_format import (
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    encode_records,
)
from waltz_engine.storage import StorageManager, wire_span
from waltz_engine.storage.segment import CorruptRecordError, Segment
from waltz_engine.wire.admin_messages import (
    ADMIN_CODEC,
    ADMIN_RAW_RECORDS_CODEC,
    AdminRecordListRawResponse,
    AdminRecordListResponse,
    record_list_raw_frame,
)
from waltz_engine.wire.primitives import write_records
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    STORAGE_RAW_RECORDS_CODEC,
    StorageRecordListRawResponse,
    StorageRecordListResponse,
)

KEY = uuid.UUID("0e7d4c2a-9b1f-4a3e-8c5d-6f2b1a9e3c70")
RECORD_COUNT = 400
# Small segments (about this many bytes each), so that answers cross several of them.
SEGMENT_BYTES = 4000
MAX_DATA_BYTES = 300


def _random_records(rng: random.Random, count: int, *, one_size: int | None) -> list[Record]:
    records = []
    for t in range(count):
        size = one_size if one_size is not None else rng.choice([0, 0, 1, 7, rng.randrange(MAX_DATA_BYTES)])
        data = rng.randbytes(size)
        req = ReqId(rng.randrange(-(2**31), 2**31), rng.randrange(2**31), 0, rng.randrange(-(2**31), 2**31))
        records.append(Record(t, req, rng.randrange(-(2**31), 2**31), data, crc32(data)))
    return records


def _store(directory: Path, records: list[Record]) -> StorageManager:
    manager = open_one_partition(directory, KEY, records_per_segment=2, record_bytes=SEGMENT_BYTES)
    partition = manager.partition(0)
    for start in range(0, len(records), 37):
        partition.append(records[start : start + 37])
    return manager


def _answer(manager: StorageManager, txid: int, count: int, *, wire: bool) -> bytes | str:
    """The record list's bytes, or the refusal's text."""
    partition = manager.partition(0)
    try:
        if wire:
            return partition.records_wire(txid, count).payload()
        out = bytearray()
        write_records(out, partition.records(txid, count))
        return bytes(out)
    except CorruptRecordError as e:
        return f"refused: {e}"


def _ranges(rng: random.Random) -> list[tuple[int, int]]:
    fixed = [(0, RECORD_COUNT), (0, RECORD_COUNT + 50), (RECORD_COUNT - 1, 5), (RECORD_COUNT, 3), (5, 0)]
    return fixed + [(rng.randrange(RECORD_COUNT), rng.randrange(1, 150)) for _ in range(40)]


@pytest.mark.parametrize("one_size", [None, 0, 100])
def test_records_wire_is_the_encoded_records(
    tmp_path: Path, one_size: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(one_size or 7)
    records = _random_records(rng, RECORD_COUNT, one_size=one_size)
    manager = _store(tmp_path, records)
    try:
        assert len(list((tmp_path / "0").glob("*.seg"))) > 3
        ranges = _ranges(rng)
        expected = [_answer(manager, txid, count, wire=False) for txid, count in ranges]

        def no_exact_reads(*args: object) -> None:
            raise AssertionError("whole records are served by columns, never record by record")

        with monkeypatch.context() as patch:
            patch.setattr(Segment, "read_records", no_exact_reads)
            for (txid, count), answer in zip(ranges, expected, strict=True):
                assert _answer(manager, txid, count, wire=True) == answer, (txid, count)
        # The frames the node sends, on both ports, are the codecs' frames of the same records.
        partition = manager.partition(0)
        raw = memoryview(partition.records_wire(3, 200).payload())
        listed = tuple(partition.records(3, 200))
        assert ADMIN_RAW_RECORDS_CODEC.encode_frame(
            AdminRecordListRawResponse(9, 0, raw)
        ) == ADMIN_CODEC.encode_frame(AdminRecordListResponse(9, 0, listed))
        # The admin port writes the answer in the pieces it was read in: the same bytes.
        pieces = record_list_raw_frame(9, 0, partition.records_wire(3, 200).record_list())
        assert b"".join(pieces) == ADMIN_CODEC.encode_frame(AdminRecordListResponse(9, 0, listed))
        assert b"".join(record_list_raw_frame(5, 0, [b"\0\0\0\0"])) == ADMIN_CODEC.encode_frame(
            AdminRecordListResponse(5, 0, ())
        )
        assert STORAGE_RAW_RECORDS_CODEC.encode_frame(
            StorageRecordListRawResponse(4, 9, 0, raw)
        ) == STORAGE_CODEC.encode_frame(StorageRecordListResponse(4, 9, 0, listed))
    finally:
        manager.close()


def _segment_of(directory: Path, txid: int) -> tuple[Path, int]:
    """The data file holding ``txid`` and the record's offset in it (from the index)."""
    firsts = sorted(int(p.stem) for p in (directory / "0").glob("*.seg"))
    first = max(f for f in firsts if f <= txid)
    seg = directory / "0" / f"{first:019d}.seg"
    index = seg.with_suffix(".idx").read_bytes()
    (offset,) = INDEX_ENTRY.unpack_from(index, HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (txid - first))
    return seg, offset


def _flip_data(directory: Path, txid: int) -> None:
    seg, offset = _segment_of(directory, txid)
    at = offset + RECORD_HEADER_SIZE_BYTES
    overwrite(seg, at, bytes([seg.read_bytes()[at] ^ 0x20]))


def _bad_checksum_good_crc(directory: Path, txid: int, record: Record) -> None:
    """Rewrite the record with a wrong data checksum and a CRC that matches it."""
    seg, offset = _segment_of(directory, txid)
    data, _ = encode_records([record._replace(checksum=record.checksum ^ 1)], offset)
    overwrite(seg, offset, data)


def _index_outside(directory: Path, txid: int) -> None:
    seg, _ = _segment_of(directory, txid)
    first = int(seg.stem)
    overwrite(
        seg.with_suffix(".idx"),
        HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (txid - first),
        INDEX_ENTRY.pack(1 << 40),
    )


@pytest.mark.parametrize("damage", ["data bit", "data checksum", "index entry"])
def test_damaged_records_answer_as_the_exact_reader(tmp_path: Path, damage: str) -> None:
    rng = random.Random(damage)
    records = _random_records(rng, RECORD_COUNT, one_size=20)
    manager = _store(tmp_path, records)
    manager.close()
    bad = [57, 58, 230]
    for txid in bad:
        if damage == "data bit":
            _flip_data(tmp_path, txid)
        elif damage == "data checksum":
            _bad_checksum_good_crc(tmp_path, txid, records[txid])
        else:
            _index_outside(tmp_path, txid)
    manager = open_one_partition(tmp_path, KEY, records_per_segment=2, record_bytes=SEGMENT_BYTES)
    try:
        for txid, count in [*_ranges(rng), (50, 30), (57, 10), (58, 1), (59, 300), (200, 100), (230, 1)]:
            expected = _answer(manager, txid, count, wire=False)
            assert _answer(manager, txid, count, wire=True) == expected, (txid, count)
        refused = _answer(manager, 57, 5, wire=True)
        assert isinstance(refused, str) and "corrupt record: partition 0 transaction 57" in refused
        short = _answer(manager, 40, 100, wire=True)
        assert isinstance(short, bytes) and short[:4] == (17).to_bytes(4, "big")
    finally:
        manager.close()


# Record by record (a short run), data checks in 2 passes, by linearity.
@pytest.mark.parametrize("count", [SMALL_RUN_MAX_RECORDS, 20, LINEAR_CHECK_MIN_RECORDS])
@pytest.mark.parametrize("one_size", [None, 0, 100])
def test_disk_to_wire_refuses_what_does_not_check_out(one_size: int | None, count: int) -> None:
    records = _random_records(random.Random(3), count, one_size=one_size)
    data, index = encode_records(records, 0)
    offsets = np.append(np.frombuffer(index, dtype=">i8").astype(np.int64), len(data))
    wire = disk_to_wire(data, offsets, 0)
    assert wire is not None
    expected = bytearray()
    write_records(expected, records)
    assert bytes(wire) == bytes(expected[4:])
    assert disk_to_wire(data, offsets, 1) is None  # txids
    for at in (0, 33, len(data) - 1, int(offsets[5]) + RECORD_HEADER_SIZE_BYTES):
        damaged = bytearray(data)
        damaged[at] ^= 1
        assert disk_to_wire(bytes(damaged), offsets, 0) is None, at
    # A wrong data checksum under a CRC that matches it: only the data check can see it.
    forged = [r._replace(checksum=r.checksum ^ 1) if r.transaction_id == 7 else r for r in records]
    assert disk_to_wire(encode_records(forged, 0)[0], offsets, 0) is None


@pytest.mark.parametrize("data_bytes", [0, 1, 7, 100, 4096])
def test_unshift_crcs_undoes_appending_the_data(data_bytes: int) -> None:
    """crc32(head + data) == S(crc32(head)) ^ crc32(data): S^-1 gives each head's CRC back."""
    rng = random.Random(data_bytes)
    heads = [rng.randbytes(RECORD_HEADER_SIZE_BYTES) for _ in range(64)]
    data = [rng.randbytes(data_bytes) for _ in range(64)]
    whole = np.array([zlib.crc32(h + d) for h, d in zip(heads, data, strict=True)], dtype=np.uint32)
    alone = np.array([zlib.crc32(d) for d in data], dtype=np.uint32)
    expected = np.array([zlib.crc32(h) for h in heads], dtype=np.uint32)
    assert np.array_equal(unshift_crcs(data_bytes, whole ^ alone), expected)


@pytest.mark.parametrize("data_bytes", [100, 700])  # 700: each record larger than a (shrunk) chunk
def test_an_answer_stops_at_its_byte_budget_however_many_records_are_asked_for(
    tmp_path: Path, data_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer asking for 2^31 - 1 records gets a short answer bounded by the byte budget (plus
    one chunk), not the whole partition read into memory; asking on from there gets the rest."""
    monkeypatch.setattr(wire_span, "CHUNK_BYTES", 512)
    records = _random_records(random.Random(data_bytes), RECORD_COUNT, one_size=data_bytes)
    manager = _store(tmp_path, records)
    budget = 3_000
    try:
        partition = manager.partition(0)
        answers = []
        txid = 0
        while txid < RECORD_COUNT:
            answer = partition.records_wire(txid, 2**31 - 1, max_bytes=budget)
            size = sum(memoryview(chunk).nbytes for chunk in answer.chunks)
            assert answer.num_records > 0 and size < budget + 512 + data_bytes + 100, (txid, size)
            answers.append(answer.payload()[4:])
            txid += answer.num_records
        assert len(answers) > 10  # many short answers, not one
        whole = bytearray()
        write_records(whole, partition.records(0, RECORD_COUNT))
        assert b"".join(answers) == bytes(whole[4:])
    finally:
        manager.close()
