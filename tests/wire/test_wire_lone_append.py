"""The server's lone-append path reads and writes bytes itself: an APPEND_REQUEST recognised by its
bytes (``recognise_append_request``) must be what the codec decodes, and a store batch encoded
from its entries (``encode_append_batch``) must be what the records' encoding is, byte for byte;
anything the recogniser does not take whole goes to the decoder, which judges it as before."""

from __future__ import annotations

from wire_vector_support import message_from_fields, wire_lines

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage.client import encode_append_batch, encode_append_records
from waltz_engine.wire.client_messages import (
    EXTENDED_CLIENT_CODECS,
    NO_LOCKS,
    AppendRequest,
    FeedData,
    FlushRequest,
    lone_append_frame,
    recognise_append_request,
)


def _append(
    data: bytes | None, locks: tuple[int, ...] = NO_LOCKS, checksum: int | None = None
) -> AppendRequest:
    return AppendRequest(
        ReqId(-7, 3, 5, 2**30 + 9),
        -1 if data is None else 123_456_789_012,
        locks,
        NO_LOCKS,
        NO_LOCKS,
        -42,
        data,
        (crc32(data) if data is not None else 0) if checksum is None else checksum,
    )


def test_a_lone_append_is_recognised_as_the_codec_decodes_it() -> None:
    for version, codec in EXTENDED_CLIENT_CODECS.items():
        for data in (b"", b"x", bytes(range(256)) * 3):
            message = _append(data)
            frame = codec.encode_frame(message)
            recognised = recognise_append_request(frame, version)
            if version < 2:
                assert recognised is None  # fewer lock arrays: the decoder's
                continue
            assert recognised == message == codec.decode(frame[7:])
            assert type(recognised.data) is bytes


def test_anything_else_is_left_to_the_decoder() -> None:
    codec = EXTENDED_CLIENT_CODECS[4]
    lone = codec.encode_frame(_append(b"data"))
    others = [
        codec.encode_frame(_append(b"data", locks=(1, 2))),  # locks
        codec.encode_frame(_append(None)),  # null data
        codec.encode_frame(_append(b"data", checksum=crc32(b"data") ^ 1)),  # a wrong checksum
        codec.encode_frame(FlushRequest(ReqId(1, 2, 3, 4))),  # another message
        lone[:-1],  # a partial frame
        lone + lone,  # two frames
        lone + b"\x00",
        lone[:20],
        b"",
    ]
    for data in others:
        assert recognise_append_request(data, 4) is None, data
    assert recognise_append_request(lone, 3) is None  # another codec version than the frame's
    assert recognise_append_request(lone, 4) is not None


def test_a_batch_is_encoded_from_its_entries_as_its_records_are() -> None:
    entries = [_append(bytes([i]) * i) for i in range(5)]
    first = 2**33 + 1
    records = [
        Record(first + i, entry.req_id, entry.header, entry.data or b"", entry.checksum)
        for i, entry in enumerate(entries)
    ]
    assert encode_append_batch(first, entries) == encode_append_records(records)  # type: ignore[arg-type]
    assert encode_append_batch(0, []) == encode_append_records([])


def test_a_commits_feed_frame_packed_at_commit_is_the_codecs() -> None:
    from waltz_engine.server.feed_cache import FeedCache
    from waltz_engine.server.feed_frames import FeedFrames

    cache = FeedCache(1024 * 1024)
    frames = FeedFrames(0, cache)
    req_ids = {txid: ReqId(-3, 2, 0, txid - 7) for txid in range(70)}
    for txid in range(3):
        cache.add(0, txid, req_ids[txid], -txid)
    for version in EXTENDED_CLIENT_CODECS:
        assert frames.frames(version, 0, 2) is not None  # the versions' tail blocks exist
    encoded = frames.frames_encoded
    for txid in range(3, 70):  # the block's slots from 3 to 63 at commit; 64.. have no block yet
        frames.add_committed(txid, req_ids[txid], -txid)
    assert frames.frames_encoded == encoded + 61 * len(EXTENDED_CLIENT_CODECS)
    for version, codec in EXTENDED_CLIENT_CODECS.items():
        view = frames.frames(version, 3, 63)
        assert view is not None
        size = len(view) // 61
        for txid in range(3, 64):
            got = bytes(view[(txid - 3) * size : (txid - 2) * size])
            assert got == codec.encode_frame(FeedData(req_ids[txid], txid, -txid)), (version, txid)


def test_the_clients_lone_append_frame_is_the_originals_bytes() -> None:
    """The client packs an APPEND without locks itself (``lone_append_frame``): for every
    APPEND_REQUEST frame the original encoded, in every codec version, it gives those bytes,
    or None (locks, a null data, a version without the three lock arrays: the codec's way)."""
    packed_versions = set()
    for line in wire_lines("client_server_L"):
        if line["name"] != "APPEND_REQUEST" or not line.get("frame_hex"):
            continue
        frame = lone_append_frame(message_from_fields(line), line["version"])
        if frame is not None:
            assert frame.hex() == line["frame_hex"], (line["version"], line["variant"])
            packed_versions.add(line["version"])
    assert packed_versions == {2, 3, 4}
