"""The client's stream decoder (every whole message per read, FeedData unpacked at once) yields
exactly what the codec decodes, frame by frame, however the stream is cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_strategies import ROUND_TRIP_EXAMPLES, message_strategy, req_ids

from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import CLIENT_CODECS, FeedData, FeedSuspended
from waltz_engine.wire.client_stream import FEED_RUN_MAX_FRAMES, ClientStreamDecoder
from waltz_engine.wire.codec import MessageSpec

CLIENT_KINDS = [(codec, spec) for codec in CLIENT_CODECS.values() for spec in codec.specs]
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
feed_data = st.builds(FeedData, req_ids, int64, int32)


def _decode_cut(decoder: ClientStreamDecoder, stream: bytes, cuts: list[int]) -> list[object]:
    decoded: list[object] = []
    previous = 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        decoded += decoder.feed(stream[previous:cut])
        previous = cut
    return decoded


@settings(max_examples=ROUND_TRIP_EXAMPLES, deadline=None)
@given(
    data=st.data(),
    version=st.sampled_from(sorted(CLIENT_CODECS)),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_any_mix_of_messages_decodes_as_the_codec_does(
    data: st.DataObject, version: int, cuts: list[int]
) -> None:
    codec = CLIENT_CODECS[version]
    specs: list[MessageSpec] = list(codec.specs)
    kinds = st.sampled_from(specs).flatmap(lambda spec: message_strategy(codec, spec))
    messages = data.draw(st.lists(feed_data | kinds, min_size=1, max_size=12))
    stream = b"".join(
        codec.encode_frame(m) if i % 3 else codec.keep_alive_frame() + codec.encode_frame(m)
        for i, m in enumerate(messages)
    )
    decoder = ClientStreamDecoder(codec)
    assert _decode_cut(decoder, stream, cuts) == messages
    assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("version", sorted(CLIENT_CODECS))
def test_a_frame_of_another_version_is_refused_and_the_decoder_stays_failed(version: int) -> None:
    other = CLIENT_CODECS[(version + 1) % len(CLIENT_CODECS)]
    decoder = ClientStreamDecoder(CLIENT_CODECS[version])
    frame = other.encode_frame(FeedData(ReqId(1, 2, 3, 4), 5, 6))
    with pytest.raises(ProtocolError):
        decoder.feed(frame)
    with pytest.raises(ProtocolError):
        decoder.feed(b"")


@settings(max_examples=25, deadline=None)
@given(
    version=st.sampled_from(sorted(CLIENT_CODECS)),
    run_lengths=st.lists(st.integers(1, FEED_RUN_MAX_FRAMES * 2 + 1), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 60_000), max_size=6),
)
def test_long_runs_of_feed_data_between_other_frames_decode_whole(
    version: int, run_lengths: list[int], cuts: list[int]
) -> None:
    """Runs longer than one struct iterator takes, split by other frames and by the reads."""
    codec = CLIENT_CODECS[version]
    messages: list[object] = []
    transaction_id = 0
    for run_length in run_lengths:
        for _ in range(run_length):
            messages.append(FeedData(ReqId(1, 2, 3, transaction_id), transaction_id, -transaction_id))
            transaction_id += 1
        messages.append(FeedSuspended(ReqId(1, 2, 3, -1)))
    stream = b"".join(codec.encode_frame(m) for m in messages)
    decoder = ClientStreamDecoder(codec)
    assert _decode_cut(decoder, stream, cuts) == messages
    assert decoder.buffered_bytes == 0


def test_a_feed_data_type_code_with_a_forged_length_goes_through_the_codec_checks() -> None:
    codec = CLIENT_CODECS[max(CLIENT_CODECS)]
    frame = bytearray(codec.encode_frame(FeedData(ReqId(1, 2, 3, 4), 5, 6)))
    frame[3:7] = (len(frame) - 7 + 1).to_bytes(4, "big")  # one byte more than the frame holds
    decoder = ClientStreamDecoder(codec)
    with pytest.raises(ProtocolError):
        decoder.feed(bytes(frame) + b"\x00")
