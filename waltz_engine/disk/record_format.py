"""Segment records and index entries (reference §1.4).

A record is ``transactionId:int64, reqId msb:int64, reqId lsb:int64, header:int32,
dataLength:int32, dataChecksum:int32, data, CRC32(all preceding bytes):int32``: 40 bytes of
overhead. An index is, after its 128-byte header, one int64 ``.seg`` offset per txid.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId

RECORD_HEADER_SIZE_BYTES = 36
RECORD_OVERHEAD_BYTES = 40
INDEX_ENTRY_SIZE_BYTES = 8
# The original flushes the index and data every time the next txid is a multiple of this.
CHECKPOINT_INTERVAL = 1000

RECORD_HEADER = struct.Struct(">qqqiii")
RECORD_CRC = struct.Struct(">i")
INDEX_ENTRY = struct.Struct(">q")
# The same layouts with the ReqId halves and the CRC unsigned: packing the raw 64/32-bit
# patterns gives the bytes of Java's signed values without a sign conversion per record.
RECORD_HEADER_UNSIGNED_REQID = struct.Struct(">qQQiii")
RECORD_CRC_UNSIGNED = struct.Struct(">I")
_MASK32 = 0xFFFFFFFF


def encoded_size(record: Record) -> int:
    return RECORD_OVERHEAD_BYTES + len(record.data)


def encode_records(records: Sequence[Record], start_offset: int) -> tuple[bytes, bytes]:
    """Encode a batch as one data buffer and its index entries (offsets from ``start_offset``).

    One buffer per batch keeps an append to one write call and one CRC per record. This is
    the engine's hottest loop: parts are joined once, the CRC is packed unsigned (same bytes
    as Java's signed int) and the ReqId bits are computed inline.
    """
    parts: list[bytes] = []
    offsets: list[int] = []
    offset = start_offset
    pack_head = RECORD_HEADER_UNSIGNED_REQID.pack
    pack_crc = RECORD_CRC_UNSIGNED.pack
    crc = zlib.crc32
    for r in records:
        offsets.append(offset)
        req = r.req_id
        data = r.data
        head = pack_head(
            r.transaction_id,
            ((req.client_id & _MASK32) << 32) | (req.generation & _MASK32),
            ((req.partition_id & _MASK32) << 32) | (req.seq_num & _MASK32),
            r.header,
            len(data),
            r.checksum,
        )
        parts += (head, data, pack_crc(crc(data, crc(head))))
        offset += RECORD_OVERHEAD_BYTES + len(data)
    return b"".join(parts), struct.pack(f">{len(offsets)}q", *offsets)


class DiskRecord(NamedTuple):
    """A record as stored, with the results of both of its checks."""

    record: Record
    offset: int
    record_checksum: int
    record_checksum_ok: bool
    checksum_ok: bool

    @property
    def size_bytes(self) -> int:
        return RECORD_OVERHEAD_BYTES + len(self.record.data)


class RecordProblem(NamedTuple):
    """Why no whole record could be read at an offset."""

    offset: int
    reason: str


def read_record(buf: bytes | memoryview, offset: int) -> DiskRecord | RecordProblem:
    """Parse the record at ``offset`` of a segment's bytes, never raising on bad bytes."""
    available = len(buf) - offset
    if offset < 0 or available < RECORD_OVERHEAD_BYTES:
        return RecordProblem(
            offset, f"incomplete record header at offset {offset} ({max(available, 0)} bytes left)"
        )
    txid, msb, lsb, header, length, checksum = RECORD_HEADER.unpack_from(buf, offset)
    if length < 0 or length > available - RECORD_OVERHEAD_BYTES:
        left = available - RECORD_OVERHEAD_BYTES
        return RecordProblem(
            offset, f"incomplete record at offset {offset}: data length {length}, {left} bytes left"
        )
    end = offset + RECORD_HEADER_SIZE_BYTES + length
    data = bytes(buf[offset + RECORD_HEADER_SIZE_BYTES : end])
    (stored,) = RECORD_CRC.unpack_from(buf, end)
    record = Record(txid, ReqId.from_bits(msb, lsb), header, data, checksum)
    return DiskRecord(
        record,
        offset,
        stored,
        crc32(buf[offset:end]) == stored,
        crc32(data) == checksum,
    )
