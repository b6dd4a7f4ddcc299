"""CRC-32 as Java's ``java.util.zip.CRC32``, stored as a signed int32.

``zlib.crc32`` computes the same polynomial and was measured faster than crcmod's C
extension on every size we use (see docs/benchmarks.md, "CRC-32"), so it is the hot path.
"""

import zlib

_SIGN_BIT = 0x80000000
_WRAP = 0x100000000


def crc32(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    """CRC-32 of ``data`` as Java's ``(int) crc32.getValue()``: a signed 32-bit int.

    ``start`` continues a running CRC given in the same signed form.
    """
    value = zlib.crc32(data, start & 0xFFFFFFFF)
    return value - _WRAP if value & _SIGN_BIT else value


def to_signed32(value: int) -> int:
    """Reinterpret an unsigned 32-bit value as Java's signed int."""
    value &= 0xFFFFFFFF
    return value - _WRAP if value & _SIGN_BIT else value
