"""A client connection's byte stream cut into 'L' messages, every whole one per read.

A server feeds a client in batches (dozens of FeedData frames in one write); reading them one
frame at a time costs two awaited reads and a copy per frame. :class:`ClientStreamDecoder`
takes whatever the socket delivered and returns every complete message in it. A run of FeedData
frames, all fixed fields, is unpacked by one struct iterator; every other frame
goes through the codec (and its checks) as before. The messages are the same either way.
"""

from __future__ import annotations

import struct
from typing import Any

from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import ClientMessage, FeedData
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.frame import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE_BYTES,
    MAX_FRAME_SIZE_BYTES,
    check_frame_header,
)

FEED_DATA_TYPE_CODE = 4
# Frame header, type, reqId (four int32), txid, header: one FeedData frame.
FEED_DATA_FRAME = struct.Struct(">BhiBiiiiqi")
FEED_DATA_PAYLOAD_SIZE_BYTES = FEED_DATA_FRAME.size - FRAME_HEADER_SIZE_BYTES
TYPE_CODE_OFFSET = FRAME_HEADER_SIZE_BYTES  # the type code is the payload's first byte
# FeedData frames unpacked per struct iterator at most (a server's batch is 64).
FEED_RUN_MAX_FRAMES = 256


class ClientStreamDecoder:
    """Messages of one 'L' codec from a byte stream; after an error the connection must close."""

    __slots__ = ("_codec", "_buffer", "_start", "_max_frame_size_bytes", "_failed")

    def __init__(self, codec: MessageCodec[Any], max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES) -> None:
        self._codec = codec
        self._buffer = bytearray()
        self._start = 0
        self._max_frame_size_bytes = max_frame_size_bytes
        self._failed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buffer) - self._start

    def feed(self, data: bytes | bytearray | memoryview) -> list[ClientMessage]:
        """Every message completed by ``data`` (keep-alives skipped), in stream order."""
        if self._failed:
            raise ProtocolError("stream decoder already failed; the connection must be closed")
        buffer = self._buffer
        if not buffer and len(data) == FEED_DATA_FRAME.size:
            # One appender's commit: one FeedData frame in a read, nothing before it. Unpacked
            # from the read's bytes, not copied through the buffer, with the run's checks.
            magic, version, length, type_code, client_id, generation, partition_id, seq_num, txid, header = (
                FEED_DATA_FRAME.unpack(data)
            )
            codec = self._codec
            if (
                type_code == FEED_DATA_TYPE_CODE
                and length == FEED_DATA_PAYLOAD_SIZE_BYTES
                and magic == codec.magic
                and version == codec.version
            ):
                new = tuple.__new__
                return [
                    new(FeedData, (new(ReqId, (client_id, generation, partition_id, seq_num)), txid, header))
                ]
        if self._start:
            # What was consumed goes before more comes in: each byte moves at most once more.
            del buffer[: self._start]
            self._start = 0
        buffer += data
        messages: list[ClientMessage] = []
        append = messages.append
        # tuple.__new__ builds the named tuples without their __new__'s extra call (a third of
        # the cost of a FeedData here).
        new = tuple.__new__
        iter_unpack_feed_data = FEED_DATA_FRAME.iter_unpack
        feed_frame_size = FEED_DATA_FRAME.size
        feed_magic = self._codec.magic
        feed_version = self._codec.version
        position = 0
        end = len(buffer)
        try:
            while end - position >= FRAME_HEADER_SIZE_BYTES:
                whole_frames = min((end - position) // feed_frame_size, FEED_RUN_MAX_FRAMES)
                if whole_frames and buffer[position + TYPE_CODE_OFFSET] == FEED_DATA_TYPE_CODE:
                    # A feed batch is a run of FeedData frames: unpack them with one C iterator
                    # (lazy: a frame of another type ends the run after one unpack). The copy
                    # is capped, so frames of other types in between cost no more than that.
                    run = 0
                    stop = position + whole_frames * feed_frame_size
                    for (
                        magic,
                        version,
                        length,
                        type_code,
                        client_id,
                        generation,
                        partition_id,
                        seq_num,
                        transaction_id,
                        header,
                    ) in iter_unpack_feed_data(buffer[position:stop]):
                        if (
                            type_code != FEED_DATA_TYPE_CODE
                            or length != FEED_DATA_PAYLOAD_SIZE_BYTES
                            or magic != feed_magic
                            or version != feed_version
                        ):
                            break
                        append(
                            new(
                                FeedData,
                                (
                                    new(ReqId, (client_id, generation, partition_id, seq_num)),
                                    transaction_id,
                                    header,
                                ),
                            )
                        )
                        run += 1
                    if run:
                        position += run * feed_frame_size
                        continue
                magic, version, length = FRAME_HEADER.unpack_from(buffer, position)
                codec = self._codec
                check_frame_header(
                    magic, version, length, codec.magic, codec.version, self._max_frame_size_bytes
                )
                stop = position + FRAME_HEADER_SIZE_BYTES + length
                if stop > end:
                    break
                if length:
                    append(codec.decode(bytes(buffer[position + FRAME_HEADER_SIZE_BYTES : stop])))
                position = stop
        except ProtocolError:
            self._failed = True
            raise
        if position == end:
            buffer.clear()
        else:
            self._start = position
        return messages
