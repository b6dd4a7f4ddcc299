"""Java's byte and ordering conventions that ZooKeeper payloads depend on (reference §0.2, §2.2).

* :class:`DataWriter` / :class:`DataReader`: ``java.io.DataOutputStream`` / ``DataInputStream``
  (big-endian, signed) including ``writeUTF``: a u16 byte length, then *modified* UTF-8 — U+0000
  as ``C0 80`` and every UTF-16 code unit of a supplementary character encoded on its own
  (a surrogate pair becomes two 3-byte sequences).
* :func:`java_string_hash`: ``String.hashCode`` over UTF-16 code units, int32 overflow.
* :class:`JavaHashMap`: the iteration order of ``java.util.HashMap`` (JDK 8–17), which decides
  the byte order of every map-shaped payload the original writes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from waltz_engine.common.errors import FormatError

UTF_MAX_SIZE_BYTES = 0xFFFF  # writeUTF's length prefix is an unsigned 16-bit count of bytes

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_UINT16 = struct.Struct(">H")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class JavaFormatError(FormatError):
    """Bytes are not a valid DataOutputStream encoding of the expected payload."""


def to_int32(value: int) -> int:
    """Wrap like Java int arithmetic."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


# --- modified UTF-8 --------------------------------------------------------------------------


def _utf16_units(text: str) -> Iterator[int]:
    for char in text:
        code = ord(char)
        if code >= 0x10000:
            code -= 0x10000
            yield 0xD800 | (code >> 10)
            yield 0xDC00 | (code & 0x3FF)
        else:
            yield code


def encode_modified_utf8(text: str) -> bytes:
    """The body of ``writeUTF`` (without the length prefix)."""
    out = bytearray()
    for unit in _utf16_units(text):
        if 0x0001 <= unit <= 0x007F:
            out.append(unit)
        elif unit <= 0x07FF:  # includes U+0000, which Java never writes as a single zero byte
            out += bytes((0xC0 | (unit >> 6), 0x80 | (unit & 0x3F)))
        else:
            out += bytes((0xE0 | (unit >> 12), 0x80 | ((unit >> 6) & 0x3F), 0x80 | (unit & 0x3F)))
    return bytes(out)


def _continuation(data: bytes, index: int) -> int:
    if index >= len(data) or data[index] & 0xC0 != 0x80:
        raise JavaFormatError(f"malformed modified UTF-8 input around byte {index}")
    return data[index] & 0x3F


def decode_modified_utf8(data: bytes) -> str:
    """Inverse of :func:`encode_modified_utf8`, as strict as ``DataInputStream.readUTF``."""
    units: list[int] = []
    index = 0
    while index < len(data):
        lead = data[index]
        if lead < 0x80:
            units.append(lead)
            index += 1
        elif lead >> 5 == 0b110:
            units.append(((lead & 0x1F) << 6) | _continuation(data, index + 1))
            index += 2
        elif lead >> 4 == 0b1110:
            high = _continuation(data, index + 1)
            units.append(((lead & 0x0F) << 12) | (high << 6) | _continuation(data, index + 2))
            index += 3
        else:
            raise JavaFormatError(f"malformed modified UTF-8 input around byte {index}")
    # Java strings are UTF-16; pair surrogates back up and keep lone ones as they are.
    chars: list[str] = []
    position = 0
    while position < len(units):
        unit = units[position]
        if 0xD800 <= unit <= 0xDBFF and position + 1 < len(units) and 0xDC00 <= units[position + 1] <= 0xDFFF:
            chars.append(chr(0x10000 + ((unit - 0xD800) << 10) + (units[position + 1] - 0xDC00)))
            position += 2
        else:
            chars.append(chr(unit))
            position += 1
    return "".join(chars)


def java_string_hash(text: str) -> int:
    """``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as int32."""
    value = 0
    for unit in _utf16_units(text):
        value = (31 * value + unit) & 0xFFFFFFFF
    return to_int32(value)


# --- DataOutputStream / DataInputStream ------------------------------------------------------


class DataWriter:
    """A ``DataOutputStream`` over an in-memory buffer."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write_int8(self, value: int) -> DataWriter:
        self._buffer += _INT8.pack(value)
        return self

    def write_int32(self, value: int) -> DataWriter:
        self._buffer += _INT32.pack(value)
        return self

    def write_int64(self, value: int) -> DataWriter:
        self._buffer += _INT64.pack(value)
        return self

    def write_utf(self, text: str) -> DataWriter:
        body = encode_modified_utf8(text)
        if len(body) > UTF_MAX_SIZE_BYTES:
            # Java throws UTFDataFormatException here; refusing keeps us from writing what it cannot read.
            raise JavaFormatError(f"string too long for writeUTF: {len(body)} bytes > {UTF_MAX_SIZE_BYTES}")
        self._buffer += _UINT16.pack(len(body)) + body
        return self

    def to_bytes(self) -> bytes:
        return bytes(self._buffer)


class DataReader:
    """A ``DataInputStream`` over bytes; every short read is a :class:`JavaFormatError`."""

    def __init__(self, data: bytes, what: str = "payload") -> None:
        self._data = data
        self._offset = 0
        self._what = what

    def _take(self, size: int) -> bytes:
        end = self._offset + size
        if end > len(self._data):
            raise JavaFormatError(f"{self._what} is truncated: needs {end} bytes, has {len(self._data)}")
        chunk = self._data[self._offset : end]
        self._offset = end
        return chunk

    def read_int8(self) -> int:
        value: int = _INT8.unpack(self._take(_INT8.size))[0]
        return value

    def read_int32(self) -> int:
        value: int = _INT32.unpack(self._take(_INT32.size))[0]
        return value

    def read_int64(self) -> int:
        value: int = _INT64.unpack(self._take(_INT64.size))[0]
        return value

    def read_count(self, element_size_bytes: int) -> int:
        """An int32 element count, checked against what is left so garbage cannot allocate much."""
        count = self.read_int32()
        if count < 0 or count * element_size_bytes > len(self._data) - self._offset:
            raise JavaFormatError(f"{self._what} has an impossible element count {count}")
        return count

    def read_utf(self) -> str:
        (size,) = _UINT16.unpack(self._take(_UINT16.size))
        return decode_modified_utf8(self._take(size))

    def expect_end(self) -> None:
        if self._offset != len(self._data):
            raise JavaFormatError(
                f"{self._what} has {len(self._data) - self._offset} unexpected trailing bytes"
            )


# --- java.util.HashMap iteration order -------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")

HASHMAP_DEFAULT_CAPACITY = 16
HASHMAP_MAXIMUM_CAPACITY = 1 << 30
HASHMAP_LOAD_FACTOR = 0.75
HASHMAP_TREEIFY_THRESHOLD = 8
HASHMAP_MIN_TREEIFY_CAPACITY = 64


def _float32(value: float) -> float:
    return float(struct.unpack(">f", struct.pack(">f", value))[0])


def _table_size_for(capacity: int) -> int:
    """``HashMap.tableSizeFor``: the smallest power of two >= capacity (at least 1)."""
    size = 1
    while size < capacity:
        size <<= 1
    return min(size, HASHMAP_MAXIMUM_CAPACITY)


class JavaHashMap(Generic[K, V]):
    """Insertion, replacement, removal and copying with ``java.util.HashMap``'s iteration order.

    Buckets are visited in index order ``(h ^ h >>> 16) & (capacity - 1)`` and hold entries in
    insertion order; the table doubles when size exceeds 0.75 × capacity (splitting buckets in
    order), and ``new HashMap<>(map)`` sizes its table from the source's size. Tree bins
    (more than 8 colliding entries in a table of 64 or more) are not modelled.
    """

    def __init__(self, hash_of: Callable[[K], int]) -> None:
        self._hash_of = hash_of
        self._table: list[list[tuple[K, V]]] | None = None
        self._threshold = 0
        self._size = 0

    @classmethod
    def copy_of(cls, source: JavaHashMap[K, V]) -> JavaHashMap[K, V]:
        """``new HashMap<>(source)`` (``putMapEntries`` as of JDK 17)."""
        copy: JavaHashMap[K, V] = cls(source._hash_of)
        size = len(source)
        if size > 0:
            wanted = _float32(_float32(size / HASHMAP_LOAD_FACTOR) + 1.0)
            capacity = int(wanted) if wanted < HASHMAP_MAXIMUM_CAPACITY else HASHMAP_MAXIMUM_CAPACITY
            copy._threshold = _table_size_for(capacity)
            for key, value in source.items():
                copy.put(key, value)
        return copy

    @classmethod
    def from_items(cls, hash_of: Callable[[K], int], items: Iterable[tuple[K, V]]) -> JavaHashMap[K, V]:
        """``new HashMap<>()`` followed by ``put`` of each item in order."""
        result: JavaHashMap[K, V] = cls(hash_of)
        for key, value in items:
            result.put(key, value)
        return result

    def __len__(self) -> int:
        return self._size

    def __contains__(self, key: object) -> bool:
        return any(entry_key == key for entry_key, _ in self.items())

    def capacity(self) -> int:
        return len(self._table) if self._table is not None else 0

    def _spread(self, key: K) -> int:
        hashed = self._hash_of(key) & 0xFFFFFFFF
        return hashed ^ (hashed >> 16)

    def _resize(self) -> None:
        old_capacity = self.capacity()
        if old_capacity > 0:
            assert old_capacity < HASHMAP_MAXIMUM_CAPACITY, "HashMap model does not cover maximum capacity"
            new_capacity = old_capacity << 1
            new_threshold = self._threshold << 1 if old_capacity >= HASHMAP_DEFAULT_CAPACITY else 0
        elif self._threshold > 0:
            new_capacity, new_threshold = self._threshold, 0
        else:
            new_capacity = HASHMAP_DEFAULT_CAPACITY
            new_threshold = int(HASHMAP_DEFAULT_CAPACITY * HASHMAP_LOAD_FACTOR)
        if new_threshold == 0:
            new_threshold = int(new_capacity * HASHMAP_LOAD_FACTOR)
        table: list[list[tuple[K, V]]] = [[] for _ in range(new_capacity)]
        # Appending in old iteration order equals Java's order-preserving lo/hi bucket split.
        for key, value in self.items():
            table[self._spread(key) & (new_capacity - 1)].append((key, value))
        self._table = table
        self._threshold = new_threshold

    def put(self, key: K, value: V) -> None:
        if self._table is None:
            self._resize()
        assert self._table is not None
        bucket = self._table[self._spread(key) & (len(self._table) - 1)]
        for index, (entry_key, _) in enumerate(bucket):
            if entry_key == key:
                bucket[index] = (key, value)  # replacing keeps the entry where it is
                return
        bucket.append((key, value))
        if len(bucket) > HASHMAP_TREEIFY_THRESHOLD:
            if len(self._table) < HASHMAP_MIN_TREEIFY_CAPACITY:
                self._resize()
            else:
                raise NotImplementedError("java.util.HashMap tree bins are not modelled")
        self._size += 1
        if self._size > self._threshold:
            self._resize()

    def get(self, key: K) -> V | None:
        for entry_key, value in self.items():
            if entry_key == key:
                return value
        return None

    def remove(self, key: K) -> None:
        if self._table is None:
            return
        bucket = self._table[self._spread(key) & (len(self._table) - 1)]
        for index, (entry_key, _) in enumerate(bucket):
            if entry_key == key:
                del bucket[index]
                self._size -= 1
                return

    def items(self) -> Iterator[tuple[K, V]]:
        if self._table is None:
            return
        for bucket in self._table:
            yield from bucket

    def keys(self) -> Iterator[K]:
        return (key for key, _ in self.items())

    def __iter__(self) -> Iterator[K]:
        return self.keys()
