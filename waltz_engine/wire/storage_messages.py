"""Server/tool <-> storage data-port messages, magic 'S', version 0 (reference §1.2).

Common header: ``type:int8, sessionId:int64, seqNum:int64, partitionId:int32``. Several
requests end with ``usedByOfflineRecovery:bool`` (reference §0.5 item 4).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple, TypeAlias

from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.disk.record_run import (
    WIRE_PREFIX_BYTES,
    WireRecordRun,
    read_wire_record_run,
    write_wire_record_run,
)
from waltz_engine.wire.codec import (
    Field,
    HeaderLayout,
    MessageCodec,
    MessageSpec,
    PayloadReader,
    field_spec,
    fixed_spec,
)
from waltz_engine.wire.frame import FRAME_HEADER
from waltz_engine.wire.primitives import (
    BOOL_SIZE_BYTES,
    INT32_SIZE_BYTES,
    RECORD_MIN_SIZE_BYTES,
    Buffer,
    SessionInfo,
    StorageRpcException,
    read_bool,
    read_i32,
    read_optional_record,
    read_optional_record_header,
    read_record_headers,
    read_records,
    read_rest,
    read_rpc_exception,
    read_session_info,
    read_uuid,
    write_bool,
    write_i32,
    write_optional_record,
    write_optional_record_header,
    write_record_headers,
    write_records,
    write_rest,
    write_rpc_exception,
    write_session_info,
    write_uuid,
)

STORAGE_MAGIC = ord("S")
STORAGE_VERSION = 0
# OPEN_REQUEST and its reply carry no session, sequence number or partition.
NO_SESSION_ID = -1
NO_SEQ_NUM = -1
NO_PARTITION_ID = -1


class StorageOpenRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    key: uuid.UUID
    num_partitions: int


class StorageLastSessionInfoRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    used_by_offline_recovery: bool


class StorageLastSessionInfoResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    last_session_info: SessionInfo


class StorageSetLowWaterMarkRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    low_water_mark: int
    used_by_offline_recovery: bool


class StorageTruncateRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int
    used_by_offline_recovery: bool


class StorageAppendRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    records: tuple[Record, ...]
    used_by_offline_recovery: bool


class StorageAppendRunRequest(NamedTuple):
    """APPEND_REQUEST as the storage node's data port reads it (:data:`STORAGE_DATA_PORT_CODEC`):
    its records kept in the bytes they came in, cut once, never a ``Record`` each; the same
    bytes as :class:`StorageAppendRequest`."""

    session_id: int
    seq_num: int
    partition_id: int
    records: WireRecordRun
    used_by_offline_recovery: bool


class StorageSuccessResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int


class StorageFailureResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    exception: StorageRpcException


class StorageRecordHeaderRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int


class StorageRecordHeaderResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    record_header: RecordHeader | None


class StorageRecordRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int


class StorageRecordResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    record: Record | None


class StorageMaxTransactionIdRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    used_by_offline_recovery: bool


class StorageMaxTransactionIdResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int


class StorageRecordHeaderListRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int
    max_num_records: int


class StorageRecordHeaderListResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    record_headers: tuple[RecordHeader, ...]


class StorageRecordListRequest(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    transaction_id: int
    max_num_records: int


class StorageRecordListResponse(NamedTuple):
    session_id: int
    seq_num: int
    partition_id: int
    records: tuple[Record, ...]


class StorageRecordListRawResponse(NamedTuple):
    """RECORD_LIST_RESPONSE with its record list (count, then the records) as bytes: what a
    storage node sends when it serves the list from the segment's bytes
    (:data:`STORAGE_RAW_RECORDS_CODEC`), the same bytes as :class:`StorageRecordListResponse`."""

    session_id: int
    seq_num: int
    partition_id: int
    records: Buffer


StorageMessage: TypeAlias = (
    StorageOpenRequest
    | StorageLastSessionInfoRequest
    | StorageLastSessionInfoResponse
    | StorageSetLowWaterMarkRequest
    | StorageTruncateRequest
    | StorageAppendRequest
    | StorageSuccessResponse
    | StorageFailureResponse
    | StorageRecordHeaderRequest
    | StorageRecordHeaderResponse
    | StorageRecordRequest
    | StorageRecordResponse
    | StorageMaxTransactionIdRequest
    | StorageMaxTransactionIdResponse
    | StorageRecordHeaderListRequest
    | StorageRecordHeaderListResponse
    | StorageRecordListRequest
    | StorageRecordListResponse
)

_HEADER_FIELD_COUNT = 3


def _header_to_wire(msg: Any) -> tuple[Any, ...]:
    head: tuple[Any, ...] = msg[:_HEADER_FIELD_COUNT]
    return head


def _header_from_wire(values: Any) -> tuple[Any, ...]:
    return tuple(values)


HEADER = HeaderLayout("qqi", _HEADER_FIELD_COUNT, _header_to_wire, _header_from_wire)

_BOOL = Field(read_bool, write_bool)
RECORD_LIST_RESPONSE_TYPE = 18
APPEND_REQUEST_TYPE = 6
SUCCESS_RESPONSE_TYPE = 7
# SUCCESS_RESPONSE as a whole frame (magic, version, length; type, sessionId, seqNum,
# partitionId): an append's answer, packed by the node and recognised by the server's storage
# client in one struct each (the codec's general path costs a dozen calls).
SUCCESS_FRAME = struct.Struct(FRAME_HEADER.format + "b" + HEADER.struct_format)
_SUCCESS_PAYLOAD_BYTES = SUCCESS_FRAME.size - FRAME_HEADER.size
# Its first bytes, the same in every SUCCESS answer.
SUCCESS_FRAME_PREFIX = FRAME_HEADER.pack(
    STORAGE_MAGIC, STORAGE_VERSION, _SUCCESS_PAYLOAD_BYTES
) + struct.pack(">b", SUCCESS_RESPONSE_TYPE)


def success_frame(session_id: int, seq_num: int, partition_id: int) -> bytes:
    """SUCCESS_RESPONSE's frame: the same bytes as ``STORAGE_CODEC.encode_frame``, in one pack."""
    return SUCCESS_FRAME.pack(
        STORAGE_MAGIC,
        STORAGE_VERSION,
        _SUCCESS_PAYLOAD_BYTES,
        SUCCESS_RESPONSE_TYPE,
        session_id,
        seq_num,
        partition_id,
    )


def _specs() -> list[MessageSpec]:
    h = HEADER
    return [
        field_spec(
            1,
            "OPEN_REQUEST",
            StorageOpenRequest,
            h,
            [Field(read_uuid, write_uuid), Field(read_i32, write_i32)],
        ),
        fixed_spec(2, "LAST_SESSION_INFO_REQUEST", StorageLastSessionInfoRequest, h, "?"),
        field_spec(
            3,
            "LAST_SESSION_INFO_RESPONSE",
            StorageLastSessionInfoResponse,
            h,
            [Field(read_session_info, write_session_info)],
        ),
        fixed_spec(4, "SET_LOW_WATER_MARK_REQUEST", StorageSetLowWaterMarkRequest, h, "q?"),
        fixed_spec(5, "TRUNCATE_REQUEST", StorageTruncateRequest, h, "q?"),
        field_spec(
            APPEND_REQUEST_TYPE,
            "APPEND_REQUEST",
            StorageAppendRequest,
            h,
            [Field(read_records, write_records), _BOOL],
        ),
        fixed_spec(SUCCESS_RESPONSE_TYPE, "SUCCESS_RESPONSE", StorageSuccessResponse, h, ""),
        field_spec(
            8, "FAILURE_RESPONSE", StorageFailureResponse, h, [Field(read_rpc_exception, write_rpc_exception)]
        ),
        fixed_spec(9, "RECORD_HEADER_REQUEST", StorageRecordHeaderRequest, h, "q"),
        field_spec(
            10,
            "RECORD_HEADER_RESPONSE",
            StorageRecordHeaderResponse,
            h,
            [Field(read_optional_record_header, write_optional_record_header)],
        ),
        fixed_spec(11, "RECORD_REQUEST", StorageRecordRequest, h, "q"),
        field_spec(
            12,
            "RECORD_RESPONSE",
            StorageRecordResponse,
            h,
            [Field(read_optional_record, write_optional_record)],
        ),
        fixed_spec(13, "MAX_TRANSACTION_ID_REQUEST", StorageMaxTransactionIdRequest, h, "?"),
        fixed_spec(14, "MAX_TRANSACTION_ID_RESPONSE", StorageMaxTransactionIdResponse, h, "q"),
        fixed_spec(15, "RECORD_HEADER_LIST_REQUEST", StorageRecordHeaderListRequest, h, "qi"),
        field_spec(
            16,
            "RECORD_HEADER_LIST_RESPONSE",
            StorageRecordHeaderListResponse,
            h,
            [Field(read_record_headers, write_record_headers)],
        ),
        fixed_spec(17, "RECORD_LIST_REQUEST", StorageRecordListRequest, h, "qi"),
        field_spec(
            RECORD_LIST_RESPONSE_TYPE,
            "RECORD_LIST_RESPONSE",
            StorageRecordListResponse,
            h,
            [Field(read_records, write_records)],
        ),
    ]


STORAGE_CODEC: MessageCodec[StorageMessage] = MessageCodec(STORAGE_MAGIC, STORAGE_VERSION, _specs())


def _raw_specs() -> list[MessageSpec]:
    raw = field_spec(
        RECORD_LIST_RESPONSE_TYPE,
        "RECORD_LIST_RESPONSE",
        StorageRecordListRawResponse,
        HEADER,
        [Field(read_rest, write_rest)],
    )
    return [raw if spec.type_code == RECORD_LIST_RESPONSE_TYPE else spec for spec in _specs()]


# The same wire format, but RECORD_LIST_RESPONSE's records are bytes, not one object each.
STORAGE_RAW_RECORDS_CODEC: MessageCodec[Any] = MessageCodec(STORAGE_MAGIC, STORAGE_VERSION, _raw_specs())


# An APPEND_REQUEST up to its first record's data: type, header, the record count, then the
# record's txid and data length (its reqId and header skipped).
_APPEND_HEAD = struct.Struct(">b" + HEADER.struct_format + "iq20xi")
# Where the record list's records start (after the type, the header and the count).
_RECORDS_START = struct.calcsize(">b" + HEADER.struct_format + "i")
# A whole APPEND_REQUEST frame's head: the frame header, then the above (one unpack: a storage
# node's lone request, read on its data connection's thread).
APPEND_FRAME_HEAD = struct.Struct(FRAME_HEADER.format + _APPEND_HEAD.format[1:])
# Where such a frame's first record starts.
APPEND_FRAME_RECORDS_START = FRAME_HEADER.size + _RECORDS_START
# A record after the first: its txid and data length.
_RECORD_PREFIX = struct.Struct(">q20xi")
assert _APPEND_HEAD.size == _RECORDS_START + WIRE_PREFIX_BYTES == _RECORDS_START + _RECORD_PREFIX.size
assert RECORD_MIN_SIZE_BYTES <= WIRE_PREFIX_BYTES + INT32_SIZE_BYTES


def read_whole_append(buf: Buffer) -> StorageAppendRunRequest | None:
    """A whole APPEND_REQUEST payload read in one pass of ``unpack_from`` (one for the head and
    the first record, one per record after it): the server's usual request, of one record with
    one appender and of 2-4 at 16 partitions. The same message as the codec's general field
    readers give, for a payload of this type whose count is at least 1, whose records each have
    a data length that is not negative, and that ends right after the last record and the flag
    byte; None for any other (refused or not: the general readers say, with their errors)."""
    size = len(buf)
    if size <= _APPEND_HEAD.size:
        return None
    kind, session_id, seq_num, partition_id, count, txid, length = _APPEND_HEAD.unpack_from(buf, 0)
    end = _APPEND_HEAD.size + length + INT32_SIZE_BYTES
    if kind != APPEND_REQUEST_TYPE or length < 0 or count < 1:
        return None
    if count == 1:
        if end + BOOL_SIZE_BYTES != size:
            return None
        run = WireRecordRun(buf, [_RECORDS_START, end], [txid], True)
    else:
        # (A count that lies stops the loop at the first record past the payload: bounded by it.)
        unpack = _RECORD_PREFIX.unpack_from
        starts = [_RECORDS_START, end]
        txids = [txid]
        consecutive = True
        for _ in range(count - 1):
            if end + WIRE_PREFIX_BYTES > size:
                return None
            next_txid, length = unpack(buf, end)
            if length < 0:
                return None
            consecutive = consecutive and next_txid == txid + 1
            txid = next_txid
            end += WIRE_PREFIX_BYTES + length + INT32_SIZE_BYTES
            starts.append(end)
            txids.append(txid)
        if end + BOOL_SIZE_BYTES != size:
            return None
        run = WireRecordRun(buf, starts, txids, consecutive)
    # (Any non-zero byte is true, as Netty's readBoolean and ``read_bool``.)
    return StorageAppendRunRequest(session_id, seq_num, partition_id, run, buf[end] != 0)


def _whole_append_reader(read: PayloadReader) -> PayloadReader:
    """``read`` (the codec's reader of APPEND_REQUEST as a run), tried after
    :func:`read_whole_append`: any payload that one does not take goes to ``read``, which
    refuses what it refuses with its errors."""

    def read_append(buf: Buffer) -> tuple[Any, int]:
        msg = read_whole_append(buf)
        return read(buf) if msg is None else (msg, len(buf))

    return read_append


def _data_port_specs() -> list[MessageSpec]:
    run = field_spec(
        APPEND_REQUEST_TYPE,
        "APPEND_REQUEST",
        StorageAppendRunRequest,
        HEADER,
        [Field(read_wire_record_run, write_wire_record_run), _BOOL],
    )
    run = run._replace(read=_whole_append_reader(run.read))
    return [run if spec.type_code == APPEND_REQUEST_TYPE else spec for spec in _specs()]


# The same wire format, as the storage node's data port reads it: an APPEND_REQUEST's records
# stay in the bytes they came in (``waltz_engine.disk.record_run``).
STORAGE_DATA_PORT_CODEC: MessageCodec[Any] = MessageCodec(STORAGE_MAGIC, STORAGE_VERSION, _data_port_specs())


def request_name(msg: Any) -> str:
    """A request's name as operators see it (logs, refusals, the audit log): the data port's
    Record-free APPEND_REQUEST is named as the message it reads."""
    kind = type(msg)
    return StorageAppendRequest.__name__ if kind is StorageAppendRunRequest else kind.__name__
