"""ReqId: the 16-byte id of a client request (reference §0.2).

On the wire and on disk it is two big-endian int64s:
``msb = clientId << 32 | (generation & 0xffffffff)`` and
``lsb = partitionId << 32 | (seqNum & 0xffffffff)``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

_TWO_LONGS = struct.Struct(">qq")
_MASK32 = 0xFFFFFFFF


def _signed32(value: int) -> int:
    value &= _MASK32
    return value - 0x100000000 if value & 0x80000000 else value


def _signed64(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - 0x10000000000000000 if value & 0x8000000000000000 else value


class ReqId(NamedTuple):
    client_id: int
    generation: int
    partition_id: int
    seq_num: int

    @property
    def most_sig_bits(self) -> int:
        return _signed64((self.client_id << 32) | (self.generation & _MASK32))

    @property
    def least_sig_bits(self) -> int:
        return _signed64((self.partition_id << 32) | (self.seq_num & _MASK32))

    @classmethod
    def from_bits(cls, msb: int, lsb: int) -> ReqId:
        return cls(_signed32(msb >> 32), _signed32(msb), _signed32(lsb >> 32), _signed32(lsb))

    def to_bytes(self) -> bytes:
        return _TWO_LONGS.pack(self.most_sig_bits, self.least_sig_bits)

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview, offset: int = 0) -> ReqId:
        msb, lsb = _TWO_LONGS.unpack_from(buf, offset)
        return cls.from_bits(msb, lsb)

    def __str__(self) -> str:
        return f"ReqId(c:{self.client_id},g:{self.generation},p:{self.partition_id},s:{self.seq_num})"

    def to_json(self) -> dict[str, int]:
        return {
            "client_id": self.client_id,
            "generation": self.generation,
            "partition_id": self.partition_id,
            "seq_num": self.seq_num,
        }
