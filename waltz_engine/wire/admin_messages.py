"""Tool <-> storage admin-port messages, magic 'A', version 0 (reference §1.3).

Common header: ``type:int8, seqNum:int64``. Type 5 is retired. Unlike the client codec,
the partition id lists here have a null form (length -1).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

from waltz_engine.common.record import Record
from waltz_engine.wire.codec import Field, HeaderLayout, MessageCodec, MessageSpec, field_spec, fixed_spec
from waltz_engine.wire.frame import FRAME_HEADER, FRAME_HEADER_SIZE_BYTES, check_frame_length
from waltz_engine.wire.primitives import (
    Buffer,
    SessionInfo,
    StorageRpcException,
    read_bool,
    read_i32,
    read_int_array,
    read_int_bool_pairs,
    read_records,
    read_rest,
    read_rpc_exception,
    read_session_info,
    read_string,
    read_uuid,
    write_bool,
    write_i32,
    write_int_array,
    write_int_bool_pairs,
    write_records,
    write_rest,
    write_rpc_exception,
    write_session_info,
    write_string,
    write_uuid,
)

ADMIN_MAGIC = ord("A")
ADMIN_VERSION = 0


class AdminSuccessResponse(NamedTuple):
    seq_num: int


class AdminFailureResponse(NamedTuple):
    seq_num: int
    exception: StorageRpcException


class AdminOpenRequest(NamedTuple):
    seq_num: int
    key: uuid.UUID
    num_partitions: int


class AdminPartitionAvailableRequest(NamedTuple):
    seq_num: int
    partition_ids: tuple[int, ...] | None
    toggled: bool


class AdminPartitionAssignmentRequest(NamedTuple):
    seq_num: int
    partition_ids: tuple[int, ...] | None
    toggled: bool
    delete_storage_files: bool


class AdminRecordListRequest(NamedTuple):
    seq_num: int
    partition_id: int
    transaction_id: int
    max_num_records: int


class AdminRecordListResponse(NamedTuple):
    seq_num: int
    partition_id: int
    records: tuple[Record, ...]


class AdminRecordListRawResponse(NamedTuple):
    """RECORD_LIST_RESPONSE as :data:`ADMIN_RAW_RECORDS_CODEC` reads it: the record list (count,
    then the records) left as the bytes that came, for a reader that parses them by columns."""

    seq_num: int
    partition_id: int
    records: memoryview


class AdminLastSessionInfoRequest(NamedTuple):
    seq_num: int
    partition_id: int


class AdminLastSessionInfoResponse(NamedTuple):
    seq_num: int
    partition_id: int
    last_session_info: SessionInfo


class AdminMetricsRequest(NamedTuple):
    seq_num: int


class AdminMetricsResponse(NamedTuple):
    seq_num: int
    metrics_json: str | None


class AdminAssignedPartitionStatusRequest(NamedTuple):
    seq_num: int


class AdminAssignedPartitionStatusResponse(NamedTuple):
    seq_num: int
    partition_status_map: tuple[tuple[int, bool], ...]


AdminMessage: TypeAlias = (
    AdminSuccessResponse
    | AdminFailureResponse
    | AdminOpenRequest
    | AdminPartitionAvailableRequest
    | AdminPartitionAssignmentRequest
    | AdminRecordListRequest
    | AdminRecordListResponse
    | AdminLastSessionInfoRequest
    | AdminLastSessionInfoResponse
    | AdminMetricsRequest
    | AdminMetricsResponse
    | AdminAssignedPartitionStatusRequest
    | AdminAssignedPartitionStatusResponse
)


def _header_to_wire(msg: Any) -> tuple[Any, ...]:
    return (msg[0],)


def _header_from_wire(values: Any) -> tuple[Any, ...]:
    return tuple(values)


HEADER = HeaderLayout("q", 1, _header_to_wire, _header_from_wire)

_I32 = Field(read_i32, write_i32)
_BOOL = Field(read_bool, write_bool)
_ID_LIST = Field(read_int_array, write_int_array)


def _specs() -> list[MessageSpec]:
    h = HEADER
    return [
        fixed_spec(1, "SUCCESS_RESPONSE", AdminSuccessResponse, h, ""),
        field_spec(
            2, "FAILURE_RESPONSE", AdminFailureResponse, h, [Field(read_rpc_exception, write_rpc_exception)]
        ),
        field_spec(3, "OPEN_REQUEST", AdminOpenRequest, h, [Field(read_uuid, write_uuid), _I32]),
        field_spec(4, "PARTITION_AVAILABLE_REQUEST", AdminPartitionAvailableRequest, h, [_ID_LIST, _BOOL]),
        field_spec(
            6, "PARTITION_ASSIGNMENT_REQUEST", AdminPartitionAssignmentRequest, h, [_ID_LIST, _BOOL, _BOOL]
        ),
        fixed_spec(7, "RECORD_LIST_REQUEST", AdminRecordListRequest, h, "iqi"),
        field_spec(
            8, "RECORD_LIST_RESPONSE", AdminRecordListResponse, h, [_I32, Field(read_records, write_records)]
        ),
        fixed_spec(9, "LAST_SESSION_INFO_REQUEST", AdminLastSessionInfoRequest, h, "i"),
        field_spec(
            10,
            "LAST_SESSION_INFO_RESPONSE",
            AdminLastSessionInfoResponse,
            h,
            [_I32, Field(read_session_info, write_session_info)],
        ),
        fixed_spec(11, "METRICS_REQUEST", AdminMetricsRequest, h, ""),
        field_spec(12, "METRICS_RESPONSE", AdminMetricsResponse, h, [Field(read_string, write_string)]),
        fixed_spec(13, "ASSIGNED_PARTITION_STATUS_REQUEST", AdminAssignedPartitionStatusRequest, h, ""),
        field_spec(
            14,
            "ASSIGNED_PARTITION_STATUS_RESPONSE",
            AdminAssignedPartitionStatusResponse,
            h,
            [Field(read_int_bool_pairs, write_int_bool_pairs)],
        ),
    ]


ADMIN_CODEC: MessageCodec[AdminMessage] = MessageCodec(ADMIN_MAGIC, ADMIN_VERSION, _specs())
RECORD_LIST_RESPONSE_TYPE = 8


def _raw_specs() -> list[MessageSpec]:
    raw = field_spec(
        RECORD_LIST_RESPONSE_TYPE,
        "RECORD_LIST_RESPONSE",
        AdminRecordListRawResponse,
        HEADER,
        [_I32, Field(read_rest, write_rest)],
    )
    return [raw if spec.type_code == RECORD_LIST_RESPONSE_TYPE else spec for spec in _specs()]


# The same wire format, but RECORD_LIST_RESPONSE's records are not decoded one object each.
ADMIN_RAW_RECORDS_CODEC: MessageCodec[Any] = MessageCodec(ADMIN_MAGIC, ADMIN_VERSION, _raw_specs())


def record_list_raw_frame(seq_num: int, partition_id: int, record_list: Sequence[Buffer]) -> list[Buffer]:
    """The frame of the RECORD_LIST_RESPONSE whose record list (int32 count, then the records) is
    ``record_list`` joined, as buffers to write in order: the same bytes as
    ``ADMIN_RAW_RECORDS_CODEC.encode_frame``, without copying the record list (megabytes per
    answer) into one buffer twice."""
    empty = AdminRecordListRawResponse(seq_num, partition_id, memoryview(b""))
    head = bytearray(ADMIN_RAW_RECORDS_CODEC.encode_frame(empty))
    parts = [memoryview(part).cast("B") for part in record_list]
    length = len(head) - FRAME_HEADER_SIZE_BYTES + sum(part.nbytes for part in parts)
    check_frame_length(length)
    magic, version, _ = FRAME_HEADER.unpack_from(head)
    FRAME_HEADER.pack_into(head, 0, magic, version, length)
    return [head, *parts]
