"""Payload encodings shared by every codec (reference §0.2), as riff's attribute reader/writer.

Readers take ``(buf, pos)`` and return ``(value, new_pos)``; writers append to a bytearray.
Fixed-size reads use ``unpack_from`` without a bounds check: a short buffer raises
``struct.error``, which the codec turns into a TruncatedMessageError for the whole message.
Variable lengths are checked against the bytes left before anything is allocated.

A ReqId is two int64s whose halves are its four int32 fields in order, so it travels as
``>iiii`` and maps to the NamedTuple without any bit arithmetic.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.errors import (
    EncodeError,
    InvalidValueError,
    NegativeLengthError,
    TruncatedMessageError,
)

Buffer: TypeAlias = bytes | bytearray | memoryview

NULL_LENGTH = -1
INT32_SIZE_BYTES = 4
BOOL_SIZE_BYTES = 1
REQ_ID_SIZE_BYTES = 16
RECORD_HEADER_SIZE_BYTES = 28  # transactionId, reqId, header
RECORD_MIN_SIZE_BYTES = 36  # a record header, data length, checksum; no data
STACK_FRAME_MIN_SIZE_BYTES = 16  # three null strings and a line number
STR_BOOL_PAIR_MIN_SIZE_BYTES = 5
INT_BOOL_PAIR_SIZE_BYTES = 5

I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
BOOL = struct.Struct(">?")
REQ_ID = struct.Struct(">iiii")
UUID_BITS = struct.Struct(">qq")
RECORD_HEADER = struct.Struct(">qiiiii")
RECORD_PREFIX = struct.Struct(">qiiiiii")  # a record header and its data length
SESSION_INFO = struct.Struct(">qqq")
INT_BOOL = struct.Struct(">i?")

assert REQ_ID.size == REQ_ID_SIZE_BYTES
assert RECORD_HEADER.size == RECORD_HEADER_SIZE_BYTES
assert RECORD_PREFIX.size + INT32_SIZE_BYTES == RECORD_MIN_SIZE_BYTES
assert INT_BOOL.size == INT_BOOL_PAIR_SIZE_BYTES

_UINT64_RANGE = 1 << 64


class SessionInfo(NamedTuple):
    """What a storage partition's control file holds about the last writer session."""

    session_id: int
    low_water_mark: int
    local_low_water_mark: int


class StackFrame(NamedTuple):
    """One ``java.lang.StackTraceElement`` as the storage sends it."""

    class_name: str | None
    method_name: str | None
    file_name: str | None
    line_number: int


class StorageRpcException(NamedTuple):
    """The error a storage node sends back: a message and the server-side stack trace."""

    message: str | None
    stack_trace: tuple[StackFrame, ...]


# -- lengths ------------------------------------------------------------------------------


def read_count(buf: Buffer, pos: int, item_min_size_bytes: int, what: str) -> tuple[int, int]:
    """A non-negative int32 count whose items must fit in what is left of the payload."""
    (count,) = I32.unpack_from(buf, pos)
    pos += INT32_SIZE_BYTES
    if count < 0:
        raise NegativeLengthError(f"{what} has negative count {count}")
    left = len(buf) - pos
    if count * item_min_size_bytes > left:
        raise TruncatedMessageError(
            f"{what} of {count} items needs at least {count * item_min_size_bytes} bytes, only {left} left"
        )
    return count, pos


def read_nullable_length(buf: Buffer, pos: int, item_size_bytes: int, what: str) -> tuple[int, int]:
    """An int32 length where -1 stands for null (returned as -1)."""
    (length,) = I32.unpack_from(buf, pos)
    if length == NULL_LENGTH:
        return length, pos + INT32_SIZE_BYTES
    return read_count(buf, pos, item_size_bytes, what)


# -- byte[], String, int[] ----------------------------------------------------------------


def read_bytes(buf: Buffer, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_nullable_length(buf, pos, 1, "byte array")
    if length == NULL_LENGTH:
        return None, pos
    end = pos + length
    return bytes(buf[pos:end]), end


def write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += I32.pack(NULL_LENGTH)
        return
    out += I32.pack(len(value))
    out += value


def read_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    raw, pos = read_bytes(buf, pos)
    if raw is None:
        return None, pos
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError as e:
        raise InvalidValueError(f"string is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def write_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += I32.pack(NULL_LENGTH)
        return
    try:
        write_bytes(out, value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise EncodeError(f"string cannot be encoded as UTF-8 ({e.reason})") from None


def read_int_array(buf: Buffer, pos: int) -> tuple[tuple[int, ...] | None, int]:
    """``int[]`` with -1 = null."""
    count, pos = read_nullable_length(buf, pos, INT32_SIZE_BYTES, "int array")
    if count == NULL_LENGTH:
        return None, pos
    return struct.unpack_from(f">{count}i", buf, pos), pos + count * INT32_SIZE_BYTES


def write_int_array(out: bytearray, values: Sequence[int] | None) -> None:
    if values is None:
        out += I32.pack(NULL_LENGTH)
        return
    out += I32.pack(len(values))
    out += struct.pack(f">{len(values)}i", *values)


def read_int_list(buf: Buffer, pos: int) -> tuple[tuple[int, ...], int]:
    """``List<Integer>`` with no null form (client-server partition lists)."""
    count, pos = read_count(buf, pos, INT32_SIZE_BYTES, "int list")
    return struct.unpack_from(f">{count}i", buf, pos), pos + count * INT32_SIZE_BYTES


def write_int_list(out: bytearray, values: Sequence[int] | None) -> None:
    if values is None:
        raise EncodeError("int list is None; this list has no null encoding (the original calls list.size())")
    write_int_array(out, values)


# -- small fixed values ---------------------------------------------------------------------


def read_i32(buf: Buffer, pos: int) -> tuple[int, int]:
    return I32.unpack_from(buf, pos)[0], pos + INT32_SIZE_BYTES


def write_i32(out: bytearray, value: int) -> None:
    out += I32.pack(value)


def read_i64(buf: Buffer, pos: int) -> tuple[int, int]:
    return I64.unpack_from(buf, pos)[0], pos + I64.size


def write_i64(out: bytearray, value: int) -> None:
    out += I64.pack(value)


def read_bool(buf: Buffer, pos: int) -> tuple[bool, int]:
    # Any non-zero byte is true, as Netty's readBoolean.
    return BOOL.unpack_from(buf, pos)[0], pos + BOOL_SIZE_BYTES


def write_bool(out: bytearray, value: bool) -> None:
    out += BOOL.pack(value)


def read_uuid(buf: Buffer, pos: int) -> tuple[uuid.UUID, int]:
    msb, lsb = UUID_BITS.unpack_from(buf, pos)
    return uuid.UUID(int=((msb % _UINT64_RANGE) << 64) | (lsb % _UINT64_RANGE)), pos + UUID_BITS.size


def write_uuid(out: bytearray, value: uuid.UUID) -> None:
    bits = value.int
    msb, lsb = bits >> 64, bits & (_UINT64_RANGE - 1)
    # Java's UUID halves are signed longs.
    out += UUID_BITS.pack(
        msb - _UINT64_RANGE if msb >> 63 else msb,
        lsb - _UINT64_RANGE if lsb >> 63 else lsb,
    )


def read_session_info(buf: Buffer, pos: int) -> tuple[SessionInfo, int]:
    return SessionInfo._make(SESSION_INFO.unpack_from(buf, pos)), pos + SESSION_INFO.size


def write_session_info(out: bytearray, value: SessionInfo) -> None:
    out += SESSION_INFO.pack(*value)


# -- records ----------------------------------------------------------------------------------


def _read_record_run(buf: Buffer, pos: int, count: int) -> tuple[list[Record], int]:
    """``count`` consecutive records; the one loop every record reader shares (hot for storage)."""
    records: list[Record] = []
    append = records.append
    unpack_prefix, unpack_i32 = RECORD_PREFIX.unpack_from, I32.unpack_from
    prefix_size = RECORD_PREFIX.size
    size = len(buf)
    for _ in range(count):
        txid, client_id, generation, partition_id, seq_num, header, length = unpack_prefix(buf, pos)
        pos += prefix_size
        if length < 0:
            # The original would carry a null through and fail later; a record always has data.
            raise InvalidValueError(f"record {txid} has data length {length}")
        end = pos + length
        if end + INT32_SIZE_BYTES > size:
            raise TruncatedMessageError(f"record {txid} with {length} data bytes runs past the payload")
        req_id = ReqId(client_id, generation, partition_id, seq_num)
        append(Record(txid, req_id, header, bytes(buf[pos:end]), unpack_i32(buf, end)[0]))
        pos = end + INT32_SIZE_BYTES
    return records, pos


def read_rest(buf: Buffer, pos: int) -> tuple[memoryview, int]:
    """Everything left in the message, as it came: a field a reader parses by columns."""
    return memoryview(buf)[pos:], len(buf)


def write_rest(out: bytearray, value: Buffer) -> None:
    out += value


def read_record(buf: Buffer, pos: int) -> tuple[Record, int]:
    records, pos = _read_record_run(buf, pos, 1)
    return records[0], pos


def _write_record_run(out: bytearray, records: Sequence[Record]) -> None:
    pack_prefix, pack_i32 = RECORD_PREFIX.pack, I32.pack
    for r in records:
        client_id, generation, partition_id, seq_num = r.req_id
        out += pack_prefix(
            r.transaction_id, client_id, generation, partition_id, seq_num, r.header, len(r.data)
        )
        out += r.data
        out += pack_i32(r.checksum)


def write_record(out: bytearray, record: Record) -> None:
    _write_record_run(out, (record,))


def read_records(buf: Buffer, pos: int) -> tuple[tuple[Record, ...], int]:
    count, pos = read_count(buf, pos, RECORD_MIN_SIZE_BYTES, "record list")
    records, pos = _read_record_run(buf, pos, count)
    return tuple(records), pos


def write_records(out: bytearray, records: Sequence[Record]) -> None:
    out += I32.pack(len(records))
    _write_record_run(out, records)


def read_optional_record(buf: Buffer, pos: int) -> tuple[Record | None, int]:
    present, pos = read_bool(buf, pos)
    return read_record(buf, pos) if present else (None, pos)


def write_optional_record(out: bytearray, record: Record | None) -> None:
    write_bool(out, record is not None)
    if record is not None:
        write_record(out, record)


def read_record_header(buf: Buffer, pos: int) -> tuple[RecordHeader, int]:
    txid, client_id, generation, partition_id, seq_num, header = RECORD_HEADER.unpack_from(buf, pos)
    return (
        RecordHeader(txid, ReqId(client_id, generation, partition_id, seq_num), header),
        pos + RECORD_HEADER_SIZE_BYTES,
    )


def write_record_header(out: bytearray, h: RecordHeader) -> None:
    out += RECORD_HEADER.pack(h.transaction_id, *h.req_id, h.header)


def read_record_headers(buf: Buffer, pos: int) -> tuple[tuple[RecordHeader, ...], int]:
    count, pos = read_count(buf, pos, RECORD_HEADER_SIZE_BYTES, "record header list")
    headers: list[RecordHeader] = []
    for _ in range(count):
        header, pos = read_record_header(buf, pos)
        headers.append(header)
    return tuple(headers), pos


def write_record_headers(out: bytearray, headers: Sequence[RecordHeader]) -> None:
    out += I32.pack(len(headers))
    for h in headers:
        write_record_header(out, h)


def read_optional_record_header(buf: Buffer, pos: int) -> tuple[RecordHeader | None, int]:
    present, pos = read_bool(buf, pos)
    return read_record_header(buf, pos) if present else (None, pos)


def write_optional_record_header(out: bytearray, header: RecordHeader | None) -> None:
    write_bool(out, header is not None)
    if header is not None:
        write_record_header(out, header)


# -- maps (kept as lists of pairs in wire order) ------------------------------------------------


def read_str_bool_pairs(buf: Buffer, pos: int) -> tuple[tuple[tuple[str | None, bool], ...], int]:
    count, pos = read_count(buf, pos, STR_BOOL_PAIR_MIN_SIZE_BYTES, "string-to-boolean map")
    pairs: list[tuple[str | None, bool]] = []
    for _ in range(count):
        key, pos = read_string(buf, pos)
        value, pos = read_bool(buf, pos)
        pairs.append((key, value))
    return tuple(pairs), pos


def write_str_bool_pairs(out: bytearray, pairs: Sequence[tuple[str | None, bool]]) -> None:
    out += I32.pack(len(pairs))
    for key, value in pairs:
        write_string(out, key)
        write_bool(out, value)


def read_int_bool_pairs(buf: Buffer, pos: int) -> tuple[tuple[tuple[int, bool], ...], int]:
    count, pos = read_count(buf, pos, INT_BOOL_PAIR_SIZE_BYTES, "int-to-boolean map")
    pairs = tuple(INT_BOOL.iter_unpack(buf[pos : pos + count * INT_BOOL_PAIR_SIZE_BYTES]))
    return pairs, pos + count * INT_BOOL_PAIR_SIZE_BYTES


def write_int_bool_pairs(out: bytearray, pairs: Sequence[tuple[int, bool]]) -> None:
    out += I32.pack(len(pairs))
    for key, value in pairs:
        out += INT_BOOL.pack(key, value)


# -- StorageRpcException ----------------------------------------------------------------------


def read_rpc_exception(buf: Buffer, pos: int) -> tuple[StorageRpcException, int]:
    message, pos = read_string(buf, pos)
    count, pos = read_count(buf, pos, STACK_FRAME_MIN_SIZE_BYTES, "stack trace")
    frames: list[StackFrame] = []
    for _ in range(count):
        class_name, pos = read_string(buf, pos)
        method_name, pos = read_string(buf, pos)
        file_name, pos = read_string(buf, pos)
        line_number, pos = read_i32(buf, pos)
        frames.append(StackFrame(class_name, method_name, file_name, line_number))
    return StorageRpcException(message, tuple(frames)), pos


def write_rpc_exception(out: bytearray, exception: StorageRpcException) -> None:
    write_string(out, exception.message)
    out += I32.pack(len(exception.stack_trace))
    for frame in exception.stack_trace:
        write_string(out, frame.class_name)
        write_string(out, frame.method_name)
        write_string(out, frame.file_name)
        out += I32.pack(frame.line_number)
