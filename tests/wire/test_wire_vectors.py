"""Every frame the Java original produced decodes to its fields and re-encodes to its bytes."""

from __future__ import annotations

from typing import Any

import pytest
from wire_vector_support import (
    all_wire_lines,
    codec_of,
    expected_decoded,
    line_id,
    message_from_fields,
    wire_lines,
)

from waltz_engine.wire.client_messages import CLIENT_CODECS
from waltz_engine.wire.codecs import ALL_CODECS
from waltz_engine.wire.describe import KEEP_ALIVE_NAME, KEEP_ALIVE_TYPE, describe_frame
from waltz_engine.wire.errors import DataChecksumError, EncodeError, InvalidValueError
from waltz_engine.wire.frame import parse_frame
from waltz_engine.wire.hello import Hello

LINES = [line for line in all_wire_lines() if line["type"] != KEEP_ALIVE_TYPE]
KEEP_ALIVES = wire_lines("keepalive")
OK = [line for line in LINES if line.get("decode") in ("ok", "ok-reencode-differs")]
DECODE_ERRORS = [line for line in LINES if line.get("decode") == "error"]
ENCODE_ERRORS = [line for line in LINES if line["frame_hex"] is None]


def test_vector_files_cover_every_case() -> None:
    # 290 + 36 + 23 + 9 lines minus the keep-alives; guards against a silently empty parametrization.
    assert len(LINES) == 290 + 36 + 23 + 9
    assert len(OK) + len(DECODE_ERRORS) + len(ENCODE_ERRORS) == len(LINES)
    assert len(KEEP_ALIVES) == 8


def _same_message(decoded: Any, expected: Any) -> bool:
    if isinstance(expected, Hello):
        # The original decodes the versions into a set.
        return set(decoded.versions) == set(expected.versions) and decoded.message == expected.message
    return bool(decoded == expected)


@pytest.mark.parametrize("line", OK, ids=line_id)
def test_decodes_to_fields_and_reencodes(line: dict[str, Any]) -> None:
    codec = codec_of(line)
    frame_bytes = bytes.fromhex(line["frame_hex"])
    frame = parse_frame(frame_bytes)
    assert (frame.magic, frame.version) == (codec.magic, codec.version)
    assert len(frame.payload) == line["payload_length"]

    decoded = codec.decode(frame.payload)
    assert _same_message(decoded, expected_decoded(line))
    assert type(decoded) is type(message_from_fields(line))

    assert codec.encode_frame(message_from_fields(line)) == frame_bytes
    reencoded = line["reencoded_hex"] if line["decode"] == "ok-reencode-differs" else line["frame_hex"]
    assert codec.encode_frame(decoded).hex() == reencoded
    assert codec.encode(decoded) == bytes.fromhex(reencoded)[7:]


@pytest.mark.parametrize("line", DECODE_ERRORS, ids=line_id)
def test_decoder_rejects(line: dict[str, Any]) -> None:
    codec = codec_of(line)
    frame_bytes = bytes.fromhex(line["frame_hex"])
    # The original's encoder wrote these frames; ours must write the same bytes.
    assert codec.encode_frame(message_from_fields(line)) == frame_bytes
    expected = DataChecksumError if "checksum error" in line["decode_error"] else InvalidValueError
    with pytest.raises(expected) as raised:
        codec.decode(parse_frame(frame_bytes).payload)
    assert str(raised.value).startswith(line["name"] + ": ")
    assert "error" in describe_frame(frame_bytes)


@pytest.mark.parametrize("line", ENCODE_ERRORS, ids=line_id)
def test_encoder_refuses(line: dict[str, Any]) -> None:
    codec = codec_of(line)
    with pytest.raises(EncodeError) as raised:
        codec.encode(message_from_fields(line))
    java_message = line["encode_error"].split(": ", 1)[1]
    if "not supported, upgrade servers" in java_message:
        assert java_message in str(raised.value)
    if "unknown message type" in java_message:
        assert "unknown message type" in str(raised.value)


@pytest.mark.parametrize("line", KEEP_ALIVES, ids=line_id)
def test_keep_alive(line: dict[str, Any]) -> None:
    codec = codec_of(line)
    frame_bytes = bytes.fromhex(line["frame_hex"])
    assert codec.keep_alive_frame() == frame_bytes
    frame = parse_frame(frame_bytes)
    assert frame.is_keep_alive
    assert codec.decode_frame(frame) is None
    assert describe_frame(frame_bytes) == {
        "magic": line["codec"],
        "version": line["version"],
        "type": KEEP_ALIVE_TYPE,
        "name": KEEP_ALIVE_NAME,
        "fields": {},
    }


def test_every_message_type_has_a_vector() -> None:
    seen = {(line["codec"], line["version"], line["type"]) for line in OK}
    for codec in ALL_CODECS:
        for spec in getattr(codec, "specs", ()):
            assert (chr(codec.magic), codec.version, spec.type_code) in seen, spec.name


def test_client_codec_versions_know_the_documented_types() -> None:
    def types(version: int) -> set[int]:
        return {s.type_code for s in CLIENT_CODECS[version].specs}

    assert types(0) == set(range(13))
    assert types(1) == set(range(15))
    assert types(2) == types(3) == set(range(21))
    assert types(4) == set(range(23))
