"""Issue 13, item 3: a record whose checksum fails never leaves the storage engine.

Every read (records, record headers, in the current segment or a sealed one) checks each
record's CRC (header and data) and its data checksum; a bad one is a ``CorruptRecordError``
naming the partition and transaction when it is the first asked for, and ends the answer
before it otherwise. The bytes on disk are left as they are.
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
from waltz_engine.disk.record_format import RECORD_HEADER_SIZE_BYTES, RECORD_OVERHEAD_BYTES
from waltz_engine.storage import StorageManager
from waltz_engine.storage.segment import CorruptRecordError

KEY = uuid.UUID("5b0c7a1e-2d4f-4e8a-9c3b-1f6d8e2a7b40")
DATA_BYTES = 24
RECORD_BYTES = RECORD_OVERHEAD_BYTES + DATA_BYTES
PER_SEGMENT = 5


def _records(first: int, count: int, bad_checksum: frozenset[int] = frozenset()) -> list[Record]:
    out = []
    for t in range(first, first + count):
        data = t.to_bytes(8, "big") * (DATA_BYTES // 8)
        out.append(Record(t, ReqId(3, 1, 0, t), t, data, crc32(data) ^ (1 if t in bad_checksum else 0)))
    return out


def _manager(directory: Path) -> StorageManager:
    return open_one_partition(
        directory, KEY, records_per_segment=PER_SEGMENT, record_bytes=RECORD_BYTES, segment_cache_capacity=1
    )


def _flip_data_bit(directory: Path, transaction_id: int) -> bytes:
    """Flip one bit of record ``transaction_id``'s data in its segment file; the file's new bytes."""
    first = transaction_id // PER_SEGMENT * PER_SEGMENT
    path = directory / "0" / f"{first:019d}.seg"
    offset = HEADER_SIZE_BYTES + (transaction_id - first) * RECORD_BYTES + RECORD_HEADER_SIZE_BYTES + 3
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0x10]), offset)
    finally:
        os.close(fd)
    return path.read_bytes()


@pytest.mark.parametrize("rotten", [7, 12])  # in a sealed segment, in the current one
def test_a_rotten_record_is_never_served(tmp_path: Path, rotten: int) -> None:
    good = _records(0, 14)
    with _manager(tmp_path) as manager:
        partition = manager.partition(0)
        partition.append(good)
        assert partition.segments == [(0, 4), (5, 9), (10, 13)]
        on_disk = _flip_data_bit(tmp_path, rotten)

        with pytest.raises(
            CorruptRecordError, match=f"partition 0 transaction {rotten}: record checksum"
        ) as e:
            partition.record(rotten)
        assert isinstance(e.value, StorageError)  # the node answers it as a FAILURE
        assert (e.value.partition_id, e.value.transaction_id) == (0, rotten)
        with pytest.raises(CorruptRecordError, match=f"transaction {rotten}"):
            partition.record_header(rotten)
        with pytest.raises(CorruptRecordError, match=f"transaction {rotten}"):
            partition.records(rotten, 10)

        # Lists stop before it (across segments too); reads after it are served.
        assert partition.records(0, 100) == good[:rotten]
        assert partition.records(rotten - 1, 100) == good[rotten - 1 : rotten]
        assert [h.transaction_id for h in partition.record_headers(0, 100)] == list(range(rotten))
        assert partition.records(rotten + 1, 100) == good[rotten + 1 :]
    path = tmp_path / "0" / f"{rotten // PER_SEGMENT * PER_SEGMENT:019d}.seg"
    assert path.read_bytes() == on_disk  # reading changed no byte


def test_a_wrong_data_checksum_is_refused_too(tmp_path: Path) -> None:
    """The record CRC covers the data checksum as stored, so it alone would pass this record."""
    records = _records(0, 6, bad_checksum=frozenset({3}))
    with _manager(tmp_path) as manager:
        partition = manager.partition(0)
        partition.append(records)
        with pytest.raises(CorruptRecordError, match="partition 0 transaction 3: data checksum mismatch"):
            partition.record(3)
        assert partition.records(0, 10) == records[:3]
        assert partition.records(4, 10) == records[4:]
