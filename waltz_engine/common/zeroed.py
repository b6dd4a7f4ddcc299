"""Fixed-size zeroed memory whose pages cost nothing until they are written.

The server's caches are sized by configuration and allocated whole when it starts (128 MB of
transaction data by default). ``bytearray(n)`` writes every byte of that up front: 0.1 s of CPU
per start and the whole size resident at once. Anonymous memory from ``mmap`` reads as zeros and
is mapped page by page on first write, so a cache costs what it holds; the configured size stays
the bound.
"""

from __future__ import annotations

import mmap
import struct
from typing import Literal


def zeroed_bytes(size_bytes: int) -> memoryview:
    """``size_bytes`` writable zero bytes (format ``B``)."""
    assert size_bytes >= 0, size_bytes
    if size_bytes == 0:
        return memoryview(bytearray())  # mmap refuses an empty mapping
    return memoryview(mmap.mmap(-1, size_bytes))


def zeroed_array(typecode: Literal["i", "q", "Q"], count: int) -> memoryview:
    """``count`` zero items of the ``struct`` format ``typecode`` (native order), indexable like
    an ``array.array`` of that type."""
    assert count >= 0, count
    return zeroed_bytes(struct.calcsize(typecode) * count).cast(typecode)
