"""Framing, strict decoding errors, the handshake and the asyncio reader, with real bytes."""

from __future__ import annotations

import asyncio
import struct

import pytest

from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.admin_messages import ADMIN_CODEC, AdminMetricsResponse, AdminPartitionAvailableRequest
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    AppendRequest,
    FeedData,
    ServerPartitionsAssignmentResponse,
)
from waltz_engine.wire.codecs import codec_for
from waltz_engine.wire.errors import (
    EncodeError,
    FrameHeaderError,
    FrameTooLargeError,
    HandshakeFailedError,
    InvalidValueError,
    NegativeLengthError,
    TrailingBytesError,
    TruncatedFrameError,
    TruncatedMessageError,
    UnknownMessageTypeError,
    UnsupportedCodecError,
)
from waltz_engine.wire.frame import MAX_FRAME_SIZE_BYTES, Frame, FrameDecoder, parse_frame, read_frame
from waltz_engine.wire.hello import (
    CLIENT_HELLO_TEXT,
    HELLO_CODEC,
    SERVER_HELLO_TEXT,
    Hello,
    java_hash_set_order,
    negotiate_version,
)
from waltz_engine.wire.storage_messages import STORAGE_CODEC

V4 = CLIENT_CODECS[4]
REQ = ReqId(1, 2, 3, 4)
FEED = FeedData(REQ, 42, -1)
FEED_FRAME = bytes.fromhex(
    "4c00040000001d04" + "00000001000000020000000300000004" + "000000000000002a" + "ffffffff"
)


def test_feed_data_frame_bytes() -> None:
    assert V4.encode_frame(FEED) == FEED_FRAME
    assert V4.decode(FEED_FRAME[7:]) == FEED


def test_decoder_splits_a_stream_fed_byte_by_byte() -> None:
    stream = FEED_FRAME + V4.keep_alive_frame() + FEED_FRAME
    decoder = FrameDecoder(ord("L"), 4)
    frames: list[Frame] = []
    for i in range(len(stream)):
        frames += decoder.feed(stream[i : i + 1])
    assert [f.payload for f in frames] == [FEED_FRAME[7:], b"", FEED_FRAME[7:]]
    assert frames[1].is_keep_alive
    assert decoder.buffered_bytes == 0


def test_decoder_switches_codec_after_hello() -> None:
    hello = HELLO_CODEC.encode_frame(Hello((0, 1, 2, 3, 4), SERVER_HELLO_TEXT))
    decoder = FrameDecoder(ord("H"), 0)
    decoder.push(hello + FEED_FRAME)
    first = decoder.next_frame()
    assert first is not None and HELLO_CODEC.decode_frame(first) == Hello((0, 1, 2, 3, 4), SERVER_HELLO_TEXT)
    decoder.expect(ord("L"), negotiate_version(range(5), (0, 1, 2, 3, 4)))
    second = decoder.next_frame()
    assert second is not None and V4.decode_frame(second) == FEED
    assert decoder.next_frame() is None


@pytest.mark.parametrize(
    ("header", "error", "words"),
    [
        (b"S\x00\x04\x00\x00\x00\x00", FrameHeaderError, "magic 0x53 ('S')"),
        (b"L\x00\x03\x00\x00\x00\x00", FrameHeaderError, "version 3"),
        (b"L\x00\x04\xff\xff\xff\xff", FrameTooLargeError, "negative"),
        (b"L\x00\x04" + struct.pack(">i", MAX_FRAME_SIZE_BYTES + 1), FrameTooLargeError, "exceeds"),
    ],
)
def test_decoder_refuses_bad_headers_before_buffering(
    header: bytes, error: type[Exception], words: str
) -> None:
    decoder = FrameDecoder(ord("L"), 4)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        decoder.feed(header)
    with pytest.raises(Exception, match="already failed"):
        decoder.feed(FEED_FRAME)


def test_decoder_limit_is_configurable() -> None:
    decoder = FrameDecoder(ord("L"), 4, max_frame_size_bytes=16)
    with pytest.raises(FrameTooLargeError, match="exceeds the maximum of 16 bytes"):
        decoder.feed(FEED_FRAME)


def test_parse_frame_errors() -> None:
    with pytest.raises(TruncatedFrameError, match="shorter than the 7-byte frame header"):
        parse_frame(FEED_FRAME[:5])
    with pytest.raises(TruncatedFrameError, match="says 29 payload bytes but only 28 follow"):
        parse_frame(FEED_FRAME[:-1])
    with pytest.raises(TrailingBytesError, match="1 trailing byte after"):
        parse_frame(FEED_FRAME + b"\x00")


def test_strict_message_errors() -> None:
    payload = FEED_FRAME[7:]
    with pytest.raises(TrailingBytesError, match=r"^FEED_DATA: 3 bytes trailing after the message$"):
        V4.decode(payload + b"abc")
    with pytest.raises(
        TruncatedMessageError, match=r"^FEED_DATA: payload ends inside the message \(only 28 bytes\)$"
    ):
        V4.decode(payload[:-1])
    with pytest.raises(UnknownMessageTypeError, match="unknown message type 99 in codec L v4"):
        V4.decode(b"\x63" + payload[1:])
    with pytest.raises(UnknownMessageTypeError, match="SERVER_PARTITIONS_HEALTH_STAT_REQUEST needs another"):
        CLIENT_CODECS[3].decode(b"\x15" + payload[1:17])
    with pytest.raises(TruncatedMessageError, match="empty payload"):
        V4.decode(b"")


def test_negative_and_oversize_lengths() -> None:
    append = AppendRequest(REQ, 0, (), (), (), 0, b"hi", 0)
    good = bytearray(V4.encode(append))
    lock_count_at = 1 + 16 + 8
    struct.pack_into(">i", good, lock_count_at, -2)
    with pytest.raises(NegativeLengthError, match="APPEND_REQUEST: int array has negative count -2"):
        V4.decode(bytes(good))
    struct.pack_into(">i", good, lock_count_at, 1_000_000)
    with pytest.raises(TruncatedMessageError, match="int array of 1000000 items"):
        V4.decode(bytes(good))


def test_invalid_utf8_is_a_protocol_error() -> None:
    payload = bytes.fromhex("0c0000000000000008000000027b7d")
    assert ADMIN_CODEC.decode(payload) == AdminMetricsResponse(8, "{}")
    with pytest.raises(InvalidValueError, match="METRICS_RESPONSE: string is not valid UTF-8"):
        ADMIN_CODEC.decode(payload[:-2] + b"\xff\xfe")


def test_record_with_null_data_is_refused() -> None:
    payload = (
        bytes.fromhex("0c0000000000000005000000000000000a0000000201")
        + bytes(28)
        + b"\xff\xff\xff\xff"
        + bytes(4)
    )
    with pytest.raises(InvalidValueError, match="RECORD_RESPONSE: record 0 has data length -1"):
        STORAGE_CODEC.decode(payload)


def test_encode_refusals() -> None:
    with pytest.raises(EncodeError, match="SERVER_PARTITIONS_ASSIGNMENT_RESPONSE: int list is None"):
        V4.encode(ServerPartitionsAssignmentResponse(REQ, None))  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="read locks not supported, upgrade servers"):
        CLIENT_CODECS[0].encode(AppendRequest(REQ, 0, (), (1,), (), 0, b"", 0))
    with pytest.raises(EncodeError, match="append locks not supported, upgrade servers"):
        CLIENT_CODECS[1].encode(AppendRequest(REQ, 0, (), (1,), (2,), 0, b"", 0))
    with pytest.raises(EncodeError, match="FEED_DATA: cannot encode"):
        V4.encode(FeedData(REQ, 2**63, 0))
    assert ADMIN_CODEC.decode(ADMIN_CODEC.encode(AdminPartitionAvailableRequest(1, None, True))) == (
        AdminPartitionAvailableRequest(1, None, True)
    )


def test_codec_lookup() -> None:
    assert codec_for(ord("L"), 2) is CLIENT_CODECS[2]
    with pytest.raises(UnsupportedCodecError, match="unsupported version 5 for magic 0x4c"):
        codec_for(ord("L"), 5)
    with pytest.raises(UnsupportedCodecError, match="unknown frame magic 0x5a"):
        codec_for(ord("Z"), 0)


def test_handshake_negotiation() -> None:
    assert negotiate_version([0, 1, 2, 3, 4], [0, 1, 2]) == 2
    assert negotiate_version([0], [0, 1, 2, 3, 4]) == 0
    with pytest.raises(HandshakeFailedError, match="no common codec version"):
        negotiate_version([3, 4], [0, 1])
    client = HELLO_CODEC.decode(HELLO_CODEC.encode(Hello((4, 3, 2, 1, 0), CLIENT_HELLO_TEXT)))
    assert client == Hello((0, 1, 2, 3, 4), CLIENT_HELLO_TEXT)


def test_java_hash_set_order() -> None:
    assert java_hash_set_order([7, -1, 32767]) == (-1, 7, 32767)
    assert java_hash_set_order([16, 0, 1, 1]) == (16, 0, 1)  # 16 and 0 share bucket 0 of 16
    # 13 values exceed 16 x 0.75, so the table has 32 buckets and 16 no longer shares bucket 0.
    assert java_hash_set_order([16, *range(12)]) == (*range(12), 16)


def _reader_with(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_read_frame_from_a_stream() -> None:
    async def scenario() -> None:
        reader = _reader_with(FEED_FRAME + V4.keep_alive_frame())
        first = await read_frame(reader, ord("L"), 4)
        assert first is not None and V4.decode_frame(first) == FEED
        second = await read_frame(reader, ord("L"), 4)
        assert second is not None and second.is_keep_alive
        assert await read_frame(reader, ord("L"), 4) is None

        with pytest.raises(TruncatedFrameError, match="ended 28 bytes into a 29-byte frame payload"):
            await read_frame(_reader_with(FEED_FRAME[:-1]), ord("L"), 4)
        with pytest.raises(TruncatedFrameError, match="3 bytes into a frame header"):
            await read_frame(_reader_with(FEED_FRAME[:3]), ord("L"), 4)
        with pytest.raises(FrameHeaderError):
            await read_frame(_reader_with(FEED_FRAME), ord("L"), 3)

    asyncio.run(scenario())
