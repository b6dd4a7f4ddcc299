"""Frames: ``magic:u8 | version:int16 | length:int32 | payload[length]``, big-endian (reference §0.1).

A frame of length 0 is a keep-alive: no payload, not even a type byte. The stream decoder
checks each header against the codec the connection uses, as riff's ``MessageDecoder`` does,
and refuses a length above :data:`MAX_FRAME_SIZE_BYTES` before buffering any of it.
"""

from __future__ import annotations

import asyncio
import struct
from typing import NamedTuple

from waltz_engine.common.errors import ProtocolError
from waltz_engine.wire.errors import (
    FrameHeaderError,
    FrameTooLargeError,
    TrailingBytesError,
    TruncatedFrameError,
)

FRAME_HEADER = struct.Struct(">Bhi")
FRAME_HEADER_SIZE_BYTES = FRAME_HEADER.size
# The original has no limit short of 2 GiB; the largest legitimate frame is a storage batch
# of records, so 64 MiB leaves room while bounding what one peer can make us buffer.
MAX_FRAME_SIZE_BYTES = 64 * 1024 * 1024
KEEP_ALIVE_PAYLOAD_BYTES = 0

assert FRAME_HEADER_SIZE_BYTES == 7


class Frame(NamedTuple):
    magic: int
    version: int
    payload: bytes

    @property
    def is_keep_alive(self) -> bool:
        return len(self.payload) == KEEP_ALIVE_PAYLOAD_BYTES


def magic_label(magic: int) -> str:
    """``0x4c ('L')``: how errors name a magic byte."""
    shown = chr(magic) if 0x20 < magic < 0x7F else "?"
    return f"0x{magic:02x} ('{shown}')"


def check_frame_header(
    magic: int,
    version: int,
    length: int,
    expected_magic: int,
    expected_version: int,
    max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES,
) -> None:
    """Raise unless a frame header fits the connection's codec and the size limit."""
    if magic != expected_magic:
        raise FrameHeaderError(
            f"frame magic {magic_label(magic)} but this connection expects {magic_label(expected_magic)}"
        )
    if version != expected_version:
        raise FrameHeaderError(
            f"frame version {version} but this connection uses {magic_label(magic)} v{expected_version}"
        )
    check_frame_length(length, max_frame_size_bytes)


def check_frame_length(length: int, max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES) -> None:
    if length < 0:
        raise FrameTooLargeError(f"frame length {length} is negative")
    if length > max_frame_size_bytes:
        raise FrameTooLargeError(f"frame length {length} exceeds the maximum of {max_frame_size_bytes} bytes")


def encode_frame(magic: int, version: int, payload: bytes) -> bytes:
    """Frame a payload that is already encoded. Codecs build frames in one buffer instead."""
    check_frame_length(len(payload))
    return FRAME_HEADER.pack(magic, version, len(payload)) + payload


def keep_alive_frame(magic: int, version: int) -> bytes:
    return FRAME_HEADER.pack(magic, version, KEEP_ALIVE_PAYLOAD_BYTES)


def parse_frame(data: bytes | bytearray | memoryview) -> Frame:
    """Exactly one whole frame, of any magic and version (for tools; connections use FrameDecoder)."""
    if len(data) < FRAME_HEADER_SIZE_BYTES:
        raise TruncatedFrameError(
            f"frame is {len(data)} bytes, shorter than the {FRAME_HEADER_SIZE_BYTES}-byte frame header"
        )
    magic, version, length = FRAME_HEADER.unpack_from(data, 0)
    check_frame_length(length)
    available = len(data) - FRAME_HEADER_SIZE_BYTES
    if available < length:
        raise TruncatedFrameError(f"frame header says {length} payload bytes but only {available} follow")
    if available > length:
        extra = available - length
        raise TrailingBytesError(
            f"{extra} trailing byte{'s' if extra != 1 else ''} after the {length}-byte frame payload"
        )
    return Frame(magic, version, bytes(data[FRAME_HEADER_SIZE_BYTES:]))


class FrameDecoder:
    """Cuts a byte stream into frames of one codec; feed it whatever the socket delivers.

    ``feed`` returns every complete frame. During the Hello handshake use ``push`` and
    ``next_frame`` instead: the bytes after the Hello frame belong to the negotiated codec,
    set with ``expect`` before asking for the next frame. After an error the decoder stays
    failed; the connection must be closed.
    """

    __slots__ = ("_buffer", "_start", "_magic", "_version", "_max_frame_size_bytes", "_failed")

    def __init__(self, magic: int, version: int, *, max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES) -> None:
        assert 0 <= magic <= 0xFF
        assert 0 <= max_frame_size_bytes <= MAX_FRAME_SIZE_BYTES
        self._buffer = bytearray()
        self._start = 0
        self._magic = magic
        self._version = version
        self._max_frame_size_bytes = max_frame_size_bytes
        self._failed = False

    def expect(self, magic: int, version: int) -> None:
        """Switch to another codec for the frames not yet returned."""
        assert 0 <= magic <= 0xFF
        self._magic = magic
        self._version = version

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    def take_unread(self) -> bytes:
        """The bytes of a frame not complete yet, taken out (for another decoder to go on with)."""
        unread = bytes(self._buffer[self._start :])
        self._buffer.clear()
        self._start = 0
        return unread

    def push(self, data: bytes | bytearray | memoryview) -> None:
        if self._failed:
            raise ProtocolError("frame decoder already failed; the connection must be closed")
        if self._start and self._start * 2 >= len(self._buffer):
            # Compact only once the consumed prefix dominates, so each byte moves O(1) times.
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive."""
        if self._failed:
            raise ProtocolError("frame decoder already failed; the connection must be closed")
        buffer = self._buffer
        start = self._start
        if len(buffer) - start < FRAME_HEADER_SIZE_BYTES:
            return None
        magic, version, length = FRAME_HEADER.unpack_from(buffer, start)
        try:
            check_frame_header(magic, version, length, self._magic, self._version, self._max_frame_size_bytes)
        except ProtocolError:
            self._failed = True
            raise
        end = start + FRAME_HEADER_SIZE_BYTES + length
        if end > len(buffer):
            return None
        with memoryview(buffer) as view:
            payload = bytes(view[start + FRAME_HEADER_SIZE_BYTES : end])
        if end == len(buffer):
            buffer.clear()
            self._start = 0
        else:
            self._start = end
        return Frame(magic, version, payload)

    def whole_payload(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """The payload of ``data`` when it is exactly one whole frame of this codec, not a
        keep-alive, and nothing is buffered: a request-response connection's usual read, cut
        with one unpack and one copy (no :class:`Frame`). None for anything else (a frame in
        parts, several, a keep-alive, a header this codec refuses): :meth:`feed` takes those,
        and refuses what it refuses with its errors."""
        size = len(data)
        if self._buffer or self._failed or size <= FRAME_HEADER_SIZE_BYTES:
            return None
        magic, version, length = FRAME_HEADER.unpack_from(data, 0)
        if (
            length != size - FRAME_HEADER_SIZE_BYTES
            or magic != self._magic
            or version != self._version
            or length > self._max_frame_size_bytes
        ):
            return None
        return bytes(data[FRAME_HEADER_SIZE_BYTES:])

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self.push(data)
        frames: list[Frame] = []
        while (frame := self.next_frame()) is not None:
            frames.append(frame)
        return frames


async def read_frame(
    reader: asyncio.StreamReader,
    magic: int,
    version: int,
    *,
    max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES,
) -> Frame | None:
    """The next frame from a stream; None at a clean end of stream between frames."""
    try:
        header = await reader.readexactly(FRAME_HEADER_SIZE_BYTES)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise TruncatedFrameError(f"stream ended {len(e.partial)} bytes into a frame header") from None
    frame_magic, frame_version, length = FRAME_HEADER.unpack(header)
    check_frame_header(frame_magic, frame_version, length, magic, version, max_frame_size_bytes)
    try:
        payload = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as e:
        raise TruncatedFrameError(
            f"stream ended {len(e.partial)} bytes into a {length}-byte frame payload"
        ) from None
    return Frame(frame_magic, frame_version, payload)
