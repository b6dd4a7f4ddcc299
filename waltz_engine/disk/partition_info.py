"""The control file's per-partition record: 76 bytes, two alternating 36-byte structs.

Record: ``partitionId:int32`` then struct 1 at offset 4 and struct 2 at offset 40. A struct
is ``sessionId:int64, lowWaterMark:int64, localLowWaterMark:int64, flags:int32,
sequenceNumber:int32, CRC32(first 32 bytes):int32``. The valid struct with the higher
sequence number is current; writes go to the other one, so a torn write rolls back.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import FormatError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES

PARTITION_INFO_SIZE_BYTES = 76
STRUCT_SIZE_BYTES = 36
STRUCT1_OFFSET = 4
STRUCT2_OFFSET = 40

FLAG_AVAILABLE = 1
FLAG_ASSIGNED = 4

_BODY = struct.Struct(">qqqii")
_CRC = struct.Struct(">i")
_PARTITION_ID = struct.Struct(">i")


def partition_info_offset(partition_id: int) -> int:
    """Byte offset of a partition's record in the control file."""
    return HEADER_SIZE_BYTES + PARTITION_INFO_SIZE_BYTES * partition_id


class PartitionInfoStruct(NamedTuple):
    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    flags: int
    sequence_number: int

    @property
    def assigned(self) -> bool:
        return bool(self.flags & FLAG_ASSIGNED)

    @property
    def available(self) -> bool:
        return bool(self.flags & FLAG_AVAILABLE)

    def to_bytes(self) -> bytes:
        body = _BODY.pack(
            self.session_id, self.low_water_mark, self.local_low_water_mark, self.flags, self.sequence_number
        )
        return body + _CRC.pack(crc32(body))


class DecodedStruct(NamedTuple):
    value: PartitionInfoStruct
    stored_checksum: int
    valid: bool


def decode_struct(buf: bytes | memoryview, offset: int = 0) -> DecodedStruct:
    body = bytes(buf[offset : offset + 32])
    (stored,) = _CRC.unpack_from(buf, offset + 32)
    return DecodedStruct(PartitionInfoStruct(*_BODY.unpack(body)), stored, crc32(body) == stored)


def initial_structs() -> tuple[PartitionInfoStruct, PartitionInfoStruct]:
    """What a freshly formatted partition holds: available, not assigned, seq -1 and 0."""
    return (
        PartitionInfoStruct(-1, -1, -1, FLAG_AVAILABLE, -1),
        PartitionInfoStruct(-1, -1, -1, FLAG_AVAILABLE, 0),
    )


def encode_record(partition_id: int, struct1: PartitionInfoStruct, struct2: PartitionInfoStruct) -> bytes:
    return _PARTITION_ID.pack(partition_id) + struct1.to_bytes() + struct2.to_bytes()


class DecodedPartitionInfo(NamedTuple):
    partition_id: int
    struct1: DecodedStruct
    struct2: DecodedStruct

    @property
    def current_index(self) -> int:
        """1 or 2: which struct is current. Raises FormatError when none can be."""
        s1, s2 = self.struct1, self.struct2
        if s1.valid and s2.valid:
            if s1.value.sequence_number == s2.value.sequence_number:
                raise FormatError(
                    f"partition {self.partition_id}: both control structs have sequence number "
                    f"{s1.value.sequence_number}"
                )
            return 1 if s1.value.sequence_number > s2.value.sequence_number else 2
        if s1.valid:
            return 1
        if s2.valid:
            return 2
        raise FormatError(
            f"partition {self.partition_id}: partition info corrupted (both structs fail their checksum)"
        )

    @property
    def current(self) -> PartitionInfoStruct:
        return (self.struct1 if self.current_index == 1 else self.struct2).value


def decode_record(buf: bytes | memoryview, offset: int = 0) -> DecodedPartitionInfo:
    if len(buf) - offset < PARTITION_INFO_SIZE_BYTES:
        raise FormatError(
            f"partition info at offset {offset} is truncated "
            f"({len(buf) - offset} of {PARTITION_INFO_SIZE_BYTES} bytes)"
        )
    (partition_id,) = _PARTITION_ID.unpack_from(buf, offset)
    return DecodedPartitionInfo(
        partition_id,
        decode_struct(buf, offset + STRUCT1_OFFSET),
        decode_struct(buf, offset + STRUCT2_OFFSET),
    )
