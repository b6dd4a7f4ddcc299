"""A JSON description of any frame, for ``waltz inspect frame`` and for logs.

``{"magic", "version", "type", "name", "fields"}`` with snake_case field names; byte arrays
are lowercase hex, UUIDs their canonical text, map-valued fields lists of ``[key, value]``
pairs in wire order. A frame that cannot be decoded becomes ``{"error": "..."}``.
"""

from __future__ import annotations

import uuid
from typing import Any

from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.codecs import codec_for
from waltz_engine.wire.frame import FRAME_HEADER, FRAME_HEADER_SIZE_BYTES, Frame, parse_frame
from waltz_engine.wire.hello import HELLO_NAME, HelloCodec

HELLO_TYPE = -1
KEEP_ALIVE_TYPE = -2
KEEP_ALIVE_NAME = "KEEP_ALIVE"


def to_json_value(value: Any) -> Any:
    """A decoded field as plain JSON values."""
    if isinstance(value, ReqId):
        return value.to_json()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {name: to_json_value(v) for name, v in value._asdict().items()}
    if isinstance(value, tuple | list):
        return [to_json_value(v) for v in value]
    assert value is None or isinstance(value, bool | int | str), type(value)
    return value


def describe_message(frame: Frame) -> dict[str, Any]:
    """The description of a whole frame; raises ProtocolError when it does not decode."""
    codec = codec_for(frame.magic, frame.version)
    head: dict[str, Any] = {"magic": chr(frame.magic), "version": frame.version}
    if frame.is_keep_alive:
        return head | {"type": KEEP_ALIVE_TYPE, "name": KEEP_ALIVE_NAME, "fields": {}}
    message = codec.decode(frame.payload)
    if isinstance(codec, HelloCodec):
        type_code, name = HELLO_TYPE, HELLO_NAME
    else:
        spec = codec.spec_for(message)
        type_code, name = spec.type_code, spec.name
    return head | {"type": type_code, "name": name, "fields": to_json_value(message)}


def describe_frame(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The description of one frame's bytes, or ``{"error": ...}`` saying what is wrong."""
    try:
        if len(data) >= FRAME_HEADER_SIZE_BYTES:
            # Name an unknown magic or version before complaining about the length.
            magic, version, _ = FRAME_HEADER.unpack_from(data, 0)
            codec_for(magic, version)
        return describe_message(parse_frame(data))
    except ProtocolError as e:
        return {"error": str(e)}
