"""The machinery every message codec shares: one spec per message type, one codec per version.

A message is a NamedTuple whose first fields are the codec's common header (after the type
byte) and whose remaining fields are the body in wire order. Three ways to build a spec:

* :func:`fixed_spec`: header and body are fixed-size; one precompiled ``struct.Struct`` does
  the whole message, which keeps the common small messages to a single pack/unpack.
* :func:`field_spec`: a fixed header then a list of field readers/writers from
  :mod:`waltz_engine.wire.primitives`.
* hand-written read/write functions for the messages whose layout depends on their values.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from waltz_engine.common.errors import ProtocolError
from waltz_engine.wire.errors import (
    EncodeError,
    TrailingBytesError,
    TruncatedMessageError,
    UnknownMessageTypeError,
)
from waltz_engine.wire.frame import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE_BYTES,
    Frame,
    check_frame_length,
    keep_alive_frame,
    magic_label,
)
from waltz_engine.wire.primitives import Buffer

M = TypeVar("M", bound=tuple[Any, ...])

PayloadWriter = Callable[[bytearray, Any], None]
PayloadReader = Callable[[Buffer], tuple[Any, int]]
FieldWriter = Callable[[bytearray, Any], None]
FieldReader = Callable[[Buffer, int], tuple[Any, int]]

TYPE_CODE_SIZE_BYTES = 1
MIN_TYPE_CODE = -128
MAX_TYPE_CODE = 127
# Struct format characters that each stand for exactly one value, so counts line up.
_ONE_VALUE_FORMATS = frozenset("bhiq?")


class MessageSpec(NamedTuple):
    """How one message type is written and read; ``write``/``read`` include the type byte."""

    type_code: int
    name: str
    cls: type[Any]
    write: PayloadWriter
    read: PayloadReader


class HeaderLayout(NamedTuple):
    """A codec's common header after the type byte, and how it maps to the first fields."""

    struct_format: str
    field_count: int
    to_wire: Callable[[Any], Sequence[Any]]
    from_wire: Callable[[Sequence[Any]], tuple[Any, ...]]


class Field(NamedTuple):
    read: FieldReader
    write: FieldWriter


def fixed_spec(
    type_code: int, name: str, cls: type[Any], header: HeaderLayout, body_format: str
) -> MessageSpec:
    whole = struct.Struct(">b" + header.struct_format + body_format)
    assert set(header.struct_format + body_format) <= _ONE_VALUE_FORMATS, name
    body_start = TYPE_CODE_SIZE_BYTES + len(header.struct_format)
    field_count = header.field_count
    to_wire, from_wire = header.to_wire, header.from_wire
    pack, unpack_from, size = whole.pack, whole.unpack_from, whole.size
    assert len(cls._fields) == field_count + len(body_format), (
        f"{name}: field count does not match its layout"
    )

    def write(out: bytearray, msg: Any) -> None:
        out += pack(type_code, *to_wire(msg), *msg[field_count:])

    def read(buf: Buffer) -> tuple[Any, int]:
        values = unpack_from(buf, 0)
        return cls(*from_wire(values[TYPE_CODE_SIZE_BYTES:body_start]), *values[body_start:]), size

    return MessageSpec(type_code, name, cls, write, read)


def field_spec(
    type_code: int, name: str, cls: type[Any], header: HeaderLayout, fields: Sequence[Field]
) -> MessageSpec:
    head = struct.Struct(">b" + header.struct_format)
    field_count = header.field_count
    to_wire, from_wire = header.to_wire, header.from_wire
    readers = tuple(f.read for f in fields)
    writers = tuple(f.write for f in fields)
    assert len(cls._fields) == field_count + len(fields), f"{name}: field count does not match its layout"

    def write(out: bytearray, msg: Any) -> None:
        out += head.pack(type_code, *to_wire(msg))
        for writer, value in zip(writers, msg[field_count:], strict=True):
            writer(out, value)

    def read(buf: Buffer) -> tuple[Any, int]:
        head_values = head.unpack_from(buf, 0)
        values = list(from_wire(head_values[TYPE_CODE_SIZE_BYTES:]))
        pos = head.size
        for reader in readers:
            value, pos = reader(buf, pos)
            values.append(value)
        return cls(*values), pos

    return MessageSpec(type_code, name, cls, write, read)


def plural_bytes(count: int) -> str:
    return f"{count} byte" if count == 1 else f"{count} bytes"


def guarded_write(name: str, label: str, write: PayloadWriter, out: bytearray, msg: Any) -> None:
    """Run a payload writer; whatever it refuses becomes an EncodeError naming the message."""
    try:
        write(out, msg)
    except (struct.error, OverflowError, TypeError, AttributeError) as e:
        raise EncodeError(f"{name}: cannot encode in codec {label}: {e}") from None
    except EncodeError as e:
        raise EncodeError(f"{name}: {e}") from None


def guarded_read(name: str, read: PayloadReader, payload: Buffer) -> Any:
    """Run a payload reader over a whole payload; every defect becomes a ProtocolError naming the message."""
    try:
        msg, end = read(payload)
    except struct.error:
        raise TruncatedMessageError(
            f"{name}: payload ends inside the message (only {plural_bytes(len(payload))})"
        ) from None
    except ProtocolError as e:
        raise type(e)(f"{name}: {e}") from None
    if end != len(payload):
        raise TrailingBytesError(f"{name}: {plural_bytes(len(payload) - end)} trailing after the message")
    return msg


class FramedCodec(Generic[M]):
    """What every codec offers on top of writing and reading payloads: frames and keep-alives."""

    __slots__ = ("magic", "version", "label")

    def __init__(self, magic: int, version: int) -> None:
        assert 0 <= magic <= 0xFF
        self.magic = magic
        self.version = version
        self.label = f"{chr(magic)} v{version}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({magic_label(self.magic)} v{self.version})"

    def _write(self, out: bytearray, msg: M) -> None:
        raise NotImplementedError

    def decode(self, payload: Buffer) -> M:
        """The message in a payload; any defect raises a ProtocolError subclass."""
        raise NotImplementedError

    def encode(self, msg: M) -> bytes:
        """The payload of ``msg``."""
        out = bytearray()
        self._write(out, msg)
        return bytes(out)

    def encode_frame(self, msg: M) -> bytes:
        """The whole frame of ``msg``, built in one buffer; send the same bytes to any peer."""
        out = bytearray(FRAME_HEADER_SIZE_BYTES)
        self._write(out, msg)
        length = len(out) - FRAME_HEADER_SIZE_BYTES
        check_frame_length(length)
        FRAME_HEADER.pack_into(out, 0, self.magic, self.version, length)
        return bytes(out)

    def keep_alive_frame(self) -> bytes:
        return keep_alive_frame(self.magic, self.version)

    def decode_frame(self, frame: Frame) -> M | None:
        """The message in a frame of this codec; None for a keep-alive."""
        assert frame.magic == self.magic and frame.version == self.version
        if frame.is_keep_alive:
            return None
        return self.decode(frame.payload)


class MessageCodec(FramedCodec[M]):
    """The codec of one (magic, version) whose payloads start with a message type byte."""

    __slots__ = ("_by_type", "_by_class", "_known_elsewhere")

    def __init__(
        self,
        magic: int,
        version: int,
        specs: Sequence[MessageSpec],
        known_elsewhere: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__(magic, version)
        self._by_type: dict[int, MessageSpec] = {}
        self._by_class: dict[type[Any], MessageSpec] = {}
        for spec in specs:
            assert MIN_TYPE_CODE <= spec.type_code <= MAX_TYPE_CODE
            assert spec.type_code not in self._by_type and spec.cls not in self._by_class, spec.name
            self._by_type[spec.type_code] = spec
            self._by_class[spec.cls] = spec
        # Types other versions of the same codec know, to say "needs another version".
        self._known_elsewhere = dict(known_elsewhere or {})

    @property
    def specs(self) -> tuple[MessageSpec, ...]:
        return tuple(self._by_type.values())

    def spec_for_type(self, type_code: int) -> MessageSpec | None:
        return self._by_type.get(type_code)

    def spec_for(self, msg: M) -> MessageSpec:
        spec = self._by_class.get(type(msg))
        if spec is None:
            raise EncodeError(f"unknown message type: {type(msg).__name__} is not in codec {self.label}")
        return spec

    def _write(self, out: bytearray, msg: M) -> None:
        spec = self.spec_for(msg)
        guarded_write(spec.name, self.label, spec.write, out, msg)

    def decode(self, payload: Buffer) -> M:
        if len(payload) < TYPE_CODE_SIZE_BYTES:
            raise TruncatedMessageError(f"codec {self.label}: empty payload has no message type")
        type_code = payload[0]
        if type_code > MAX_TYPE_CODE:
            type_code -= 256
        spec = self._by_type.get(type_code)
        if spec is None:
            elsewhere = self._known_elsewhere.get(type_code)
            hint = f" ({elsewhere} needs another codec version)" if elsewhere else ""
            raise UnknownMessageTypeError(f"unknown message type {type_code} in codec {self.label}{hint}")
        decoded: M = guarded_read(spec.name, spec.read, payload)
        return decoded
