"""Fuzzing every decoder: whatever the bytes, only ProtocolError subclasses escape.

The default example counts keep the suite fast; for a long run set, e.g.,
``WALTZ_FUZZ_EXAMPLES=100000 pytest tests/wire/test_wire_fuzz.py``.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import FUZZ_EXAMPLES, every_message_kind, kind_id, message_strategy

from waltz_engine.common.errors import ProtocolError
from waltz_engine.wire.codec import MessageCodec, MessageSpec
from waltz_engine.wire.codecs import ALL_CODECS, AnyCodec
from waltz_engine.wire.describe import describe_frame
from waltz_engine.wire.frame import FrameDecoder, parse_frame

KINDS = every_message_kind()
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_protocol_error(codec: AnyCodec, payload: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        codec.decode(payload)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.label.replace(" ", ""))
@FUZZ
@given(data=st.data(), tail=st.binary(max_size=200))
def test_random_payloads(codec: AnyCodec, data: st.DataObject, tail: bytes) -> None:
    # A valid type byte most of the time, so the fuzz reaches every message decoder.
    if isinstance(codec, MessageCodec) and data.draw(st.integers(0, 9)):
        type_code = data.draw(st.sampled_from([s.type_code for s in codec.specs]))
        tail = (type_code & 0xFF).to_bytes(1, "big") + tail
    _decode_or_protocol_error(codec, tail)


@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
@FUZZ
@given(data=st.data())
def test_truncated_and_flipped_messages(
    kind: tuple[AnyCodec, MessageSpec | None], data: st.DataObject
) -> None:
    codec, spec = kind
    payload = codec.encode(data.draw(message_strategy(codec, spec)))

    # A proper prefix of a valid message never decodes: the decoder needs the bytes it read before.
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(ProtocolError):
        codec.decode(payload[:cut])
    with pytest.raises(ProtocolError):
        codec.decode(payload + data.draw(st.binary(min_size=1, max_size=8)))

    flipped = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        bit = data.draw(st.integers(0, len(payload) * 8 - 1))
        flipped[bit // 8] ^= 1 << (bit % 8)
    _decode_or_protocol_error(codec, bytes(flipped))


@FUZZ
@given(stream=st.binary(max_size=300), chunk=st.integers(1, 64))
def test_frame_decoder_on_random_streams(stream: bytes, chunk: int) -> None:
    decoder = FrameDecoder(ord("L"), 4, max_frame_size_bytes=1024)
    try:
        for start in range(0, len(stream), chunk):
            decoder.feed(stream[start : start + chunk])
    except ProtocolError:
        pass


@FUZZ
@given(
    header=st.sampled_from([b"L\x00\x04", b"S\x00\x00", b"A\x00\x00", b"H\x00\x00", b""]),
    rest=st.binary(max_size=120),
)
def test_describe_never_raises(header: bytes, rest: bytes) -> None:
    result = describe_frame(header + rest)
    assert ("error" in result) != ("name" in result)
    try:
        parse_frame(header + rest)
    except ProtocolError:
        assert "error" in result
