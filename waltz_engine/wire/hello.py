"""The Hello handshake, magic 'H' version 0 (reference §0.1).

Payload: ``int32 n, n x int16 supportedVersions, string text`` with no type byte. Each side
sends one Hello on connect and both pick the highest version they share.

The original decodes the versions into a ``java.util.HashSet``, so a decoded Hello re-encodes
its versions in HashSet iteration order; :func:`java_hash_set_order` reproduces that order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from waltz_engine.wire.codec import FramedCodec, guarded_read, guarded_write
from waltz_engine.wire.errors import HandshakeFailedError
from waltz_engine.wire.primitives import I32, Buffer, read_count, read_string, write_string

HELLO_MAGIC = ord("H")
HELLO_VERSION = 0
HELLO_NAME = "HELLO"

SERVER_HELLO_TEXT = "Waltz Server"
CLIENT_HELLO_TEXT = "Waltz Client"
STORAGE_SERVER_HELLO_TEXT = "Waltz Storage Server"
STORAGE_CLIENT_HELLO_TEXT = "Waltz Storage Client"
STORAGE_ADMIN_SERVER_HELLO_TEXT = "Waltz Storage Admin Server"
STORAGE_ADMIN_CLIENT_HELLO_TEXT = "Waltz Storage Admin Client"

VERSION_SIZE_BYTES = 2
# java.util.HashMap: initial table size and the load factor that triggers doubling it.
_JAVA_HASH_TABLE_INITIAL_CAPACITY = 16
_JAVA_HASH_LOAD_FACTOR = 0.75


class Hello(NamedTuple):
    versions: tuple[int, ...]
    message: str | None


def java_hash_set_order(values: Iterable[int]) -> tuple[int, ...]:
    """Distinct ``short`` values in the order a ``java.util.HashSet`` filled with them iterates.

    Buckets are ``(h ^ h >>> 16) & (capacity - 1)`` with ``h`` the value as an int; a bucket
    keeps insertion order, and resizing preserves it, so only the final capacity matters.
    """
    distinct = list(dict.fromkeys(values))
    capacity = _JAVA_HASH_TABLE_INITIAL_CAPACITY
    while len(distinct) > capacity * _JAVA_HASH_LOAD_FACTOR:
        capacity *= 2

    def bucket(value: int) -> int:
        h = value & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return tuple(sorted(distinct, key=bucket))  # sorted() is stable: insertion order per bucket


def negotiate_version(ours: Iterable[int], theirs: Iterable[int]) -> int:
    """The highest version both sides support."""
    mine, peers = set(ours), set(theirs)
    common = mine & peers
    if not common:
        raise HandshakeFailedError(
            f"handshake failed: no common codec version (ours {sorted(mine)}, theirs {sorted(peers)})"
        )
    return max(common)


def _write_hello(out: bytearray, hello: Hello) -> None:
    out += I32.pack(len(hello.versions))
    out += struct.pack(f">{len(hello.versions)}h", *hello.versions)
    write_string(out, hello.message)


def _read_hello(payload: Buffer) -> tuple[Hello, int]:
    count, pos = read_count(payload, 0, VERSION_SIZE_BYTES, "version list")
    versions = struct.unpack_from(f">{count}h", payload, pos)
    message, pos = read_string(payload, pos + count * VERSION_SIZE_BYTES)
    return Hello(java_hash_set_order(versions), message), pos


class HelloCodec(FramedCodec[Hello]):
    """Hello payloads have no type byte; otherwise the same surface as MessageCodec."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(HELLO_MAGIC, HELLO_VERSION)

    def _write(self, out: bytearray, msg: Hello) -> None:
        guarded_write(HELLO_NAME, self.label, _write_hello, out, msg)

    def decode(self, payload: Buffer) -> Hello:
        hello: Hello = guarded_read(HELLO_NAME, _read_hello, payload)
        return hello


HELLO_CODEC = HelloCodec()
