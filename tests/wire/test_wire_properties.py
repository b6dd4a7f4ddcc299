"""Random valid messages of every type and codec version round-trip exactly."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import ROUND_TRIP_EXAMPLES, every_message_kind, kind_id, message_strategy

from waltz_engine.wire.codec import MessageSpec
from waltz_engine.wire.codecs import AnyCodec
from waltz_engine.wire.frame import FrameDecoder, parse_frame

KINDS = every_message_kind()


def test_every_message_kind_is_generated() -> None:
    # 13 + 15 + 21 + 21 + 23 client types, 18 storage, 13 admin, Hello.
    assert len(KINDS) == 93 + 18 + 13 + 1


@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
@settings(max_examples=ROUND_TRIP_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(kind: tuple[AnyCodec, MessageSpec | None], data: st.DataObject) -> None:
    codec, spec = kind
    msg = data.draw(message_strategy(codec, spec))
    payload = codec.encode(msg)
    decoded: Any = codec.decode(payload)
    assert decoded == msg
    assert codec.encode(decoded) == payload

    frame_bytes = codec.encode_frame(msg)
    frame = parse_frame(frame_bytes)
    assert (frame.magic, frame.version, frame.payload) == (codec.magic, codec.version, payload)
    assert codec.decode_frame(frame) == msg


@settings(max_examples=ROUND_TRIP_EXAMPLES, deadline=None)
@given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_frame_decoder_reassembles_any_chunking(data: st.DataObject, cuts: list[int]) -> None:
    codec, spec = data.draw(st.sampled_from(KINDS))
    messages = data.draw(st.lists(message_strategy(codec, spec), min_size=1, max_size=4))
    stream = b"".join(
        codec.encode_frame(m) if i % 2 == 0 else codec.keep_alive_frame() + codec.encode_frame(m)
        for i, m in enumerate(messages)
    )
    decoder = FrameDecoder(codec.magic, codec.version)
    frames = []
    previous = 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        frames += decoder.feed(stream[previous:cut])
        previous = cut
    decoded = [codec.decode_frame(f) for f in frames]
    assert [m for m in decoded if m is not None] == messages
    assert decoder.buffered_bytes == 0
