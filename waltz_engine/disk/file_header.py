"""The 128-byte headers of the control file and of segment data/index files (reference §1.4).

Control file: ``version:int32, creationTime:int64, key msb:int64, key lsb:int64,
numPartitions:int32``, zero padded. Segment ``.seg``/``.idx``: ``version:int32,
creationTime:int64, key msb, key lsb, partitionId:int32, firstTransactionId:int64``,
zero padded. All big-endian.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from waltz_engine.common.errors import FormatError

HEADER_SIZE_BYTES = 128
FORMAT_VERSION = 0

_CONTROL = struct.Struct(">iqqqi")
_SEGMENT = struct.Struct(">iqqqiq")


def uuid_from_bits(msb: int, lsb: int) -> uuid.UUID:
    return uuid.UUID(int=((msb & 0xFFFFFFFFFFFFFFFF) << 64) | (lsb & 0xFFFFFFFFFFFFFFFF))


def uuid_to_bits(key: uuid.UUID) -> tuple[int, int]:
    msb, lsb = key.int >> 64, key.int & 0xFFFFFFFFFFFFFFFF
    return (msb - (1 << 64) if msb >> 63 else msb, lsb - (1 << 64) if lsb >> 63 else lsb)


class ControlFileHeader(NamedTuple):
    version: int
    creation_time_ms: int
    key: uuid.UUID
    num_partitions: int

    def to_bytes(self) -> bytes:
        msb, lsb = uuid_to_bits(self.key)
        body = _CONTROL.pack(self.version, self.creation_time_ms, msb, lsb, self.num_partitions)
        return body.ljust(HEADER_SIZE_BYTES, b"\0")

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> ControlFileHeader:
        if len(buf) < HEADER_SIZE_BYTES:
            raise FormatError(f"control file header is {len(buf)} bytes, expected {HEADER_SIZE_BYTES}")
        version, created, msb, lsb, num_partitions = _CONTROL.unpack_from(buf, 0)
        if version != FORMAT_VERSION:
            raise FormatError(f"unsupported control file version {version} (expected 0)")
        if num_partitions < 0:
            raise FormatError(f"control file header has a negative partition count {num_partitions}")
        return cls(version, created, uuid_from_bits(msb, lsb), num_partitions)


class SegmentFileHeader(NamedTuple):
    version: int
    creation_time_ms: int
    key: uuid.UUID
    partition_id: int
    first_transaction_id: int

    def to_bytes(self) -> bytes:
        msb, lsb = uuid_to_bits(self.key)
        body = _SEGMENT.pack(
            self.version, self.creation_time_ms, msb, lsb, self.partition_id, self.first_transaction_id
        )
        return body.ljust(HEADER_SIZE_BYTES, b"\0")

    @classmethod
    def from_bytes_unchecked(cls, buf: bytes | memoryview) -> SegmentFileHeader | None:
        """The fields as stored, none validated (what a damaged header still says); None when
        there are too few bytes to hold them."""
        if len(buf) < _SEGMENT.size:
            return None
        version, created, msb, lsb, partition_id, first_txid = _SEGMENT.unpack_from(buf, 0)
        return cls(version, created, uuid_from_bits(msb, lsb), partition_id, first_txid)

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> SegmentFileHeader:
        if len(buf) < HEADER_SIZE_BYTES:
            raise FormatError(f"segment file header is {len(buf)} bytes, expected {HEADER_SIZE_BYTES}")
        version, created, msb, lsb, partition_id, first_txid = _SEGMENT.unpack_from(buf, 0)
        if version != FORMAT_VERSION:
            raise FormatError(f"unsupported segment file version {version} (expected 0)")
        if first_txid < 0 or partition_id < 0:
            raise FormatError(
                f"segment header is not valid (partition {partition_id}, first txid {first_txid})"
            )
        return cls(version, created, uuid_from_bits(msb, lsb), partition_id, first_txid)
