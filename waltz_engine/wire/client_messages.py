"""Client <-> server messages, magic 'L', codec versions 0-4 (reference §3.3), and our version 5.

Common header: ``type:int8, reqId``. Versions differ only in which types exist (13-14 from
v1, 15-20 from v2, 21-22 in v4), in APPEND_REQUEST's lock arrays (write only in v0, +read in
v1, +append from v2) and in MOUNT_RESPONSE (a READY boolean up to v2, the int32 state from v3).

Version 5 is ours (the original never offers it, so a Java peer never speaks it): version 4 plus
AUTHORIZATION_FAILURE (23), a server's refusal of a request by its ACLs. Only a server with the
authorizer on and a client that presents a certificate offer it (``EXTENDED_CLIENT_CODECS``);
``CLIENT_CODECS`` stays the original's versions.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple, TypeAlias

from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.codec import Field, HeaderLayout, MessageCodec, MessageSpec, field_spec, fixed_spec
from waltz_engine.wire.errors import DataChecksumError, EncodeError, InvalidValueError
from waltz_engine.wire.frame import FRAME_HEADER, FRAME_HEADER_SIZE_BYTES, MAX_FRAME_SIZE_BYTES
from waltz_engine.wire.primitives import (
    I32,
    INT32_SIZE_BYTES,
    Buffer,
    read_bool,
    read_bytes,
    read_i32,
    read_int_array,
    read_int_bool_pairs,
    read_int_list,
    read_str_bool_pairs,
    read_string,
    write_bytes,
    write_i32,
    write_int_array,
    write_int_bool_pairs,
    write_int_list,
    write_str_bool_pairs,
    write_string,
)

CLIENT_MAGIC = ord("L")
CLIENT_VERSIONS = (0, 1, 2, 3, 4)
CURRENT_CLIENT_VERSION = 4
AUTHORIZATION_VERSION = 5

PARTITION_STATE_READY = 0
PARTITION_STATE_NOT_READY = 1
PARTITION_STATE_CLIENT_AHEAD = 2

# APPEND_REQUEST carries this many lock arrays per codec version.
_READ_LOCKS_SINCE_VERSION = 1
_APPEND_LOCKS_SINCE_VERSION = 2
_INT_STATE_SINCE_VERSION = 3

NO_LOCKS: tuple[int, ...] = ()


class MountRequest(NamedTuple):
    req_id: ReqId
    client_high_water_mark: int
    seq_num: int


class MountResponse(NamedTuple):
    req_id: ReqId
    partition_state: int


class AppendRequest(NamedTuple):
    req_id: ReqId
    client_high_water_mark: int
    write_lock_request: tuple[int, ...] | None
    read_lock_request: tuple[int, ...] | None
    append_lock_request: tuple[int, ...] | None
    header: int
    data: bytes | None
    checksum: int


class FeedRequest(NamedTuple):
    req_id: ReqId
    client_high_water_mark: int


class FeedData(NamedTuple):
    req_id: ReqId
    transaction_id: int
    header: int


class FeedSuspended(NamedTuple):
    req_id: ReqId


class TransactionDataRequest(NamedTuple):
    req_id: ReqId
    transaction_id: int


class TransactionDataResponse(NamedTuple):
    """Either ``data`` + ``checksum`` (data not None) or an error ``exception_message``."""

    req_id: ReqId
    transaction_id: int
    data: bytes | None = None
    checksum: int = 0
    exception_message: str | None = None


class FlushRequest(NamedTuple):
    req_id: ReqId


class FlushResponse(NamedTuple):
    req_id: ReqId
    transaction_id: int


class LockFailure(NamedTuple):
    req_id: ReqId
    transaction_id: int


class HighWaterMarkRequest(NamedTuple):
    req_id: ReqId


class HighWaterMarkResponse(NamedTuple):
    req_id: ReqId
    transaction_id: int


class CheckStorageConnectivityRequest(NamedTuple):
    req_id: ReqId


class CheckStorageConnectivityResponse(NamedTuple):
    req_id: ReqId
    storage_connectivity_map: tuple[tuple[str | None, bool], ...]


class ServerPartitionsAssignmentRequest(NamedTuple):
    req_id: ReqId


class ServerPartitionsAssignmentResponse(NamedTuple):
    req_id: ReqId
    server_partition_assignments: tuple[int, ...]


class AddPreferredPartitionRequest(NamedTuple):
    req_id: ReqId
    partition_ids: tuple[int, ...]


class AddPreferredPartitionResponse(NamedTuple):
    req_id: ReqId
    result: bool


class RemovePreferredPartitionRequest(NamedTuple):
    req_id: ReqId
    partition_ids: tuple[int, ...]


class RemovePreferredPartitionResponse(NamedTuple):
    req_id: ReqId
    result: bool


class ServerPartitionsHealthStatRequest(NamedTuple):
    req_id: ReqId


class ServerPartitionsHealthStatResponse(NamedTuple):
    req_id: ReqId
    server_partition_health_stats: tuple[tuple[int, bool], ...]


class AuthorizationFailure(NamedTuple):
    """v5: the request ``req_id`` (of type ``request_type``) was refused: ``principal`` may not
    ``operation`` on ``partition_id`` (-1: a request about no one partition). Nothing of it was done."""

    req_id: ReqId
    request_type: int
    operation: str | None
    partition_id: int
    principal: str | None


ClientMessage: TypeAlias = (
    MountRequest
    | MountResponse
    | AppendRequest
    | FeedRequest
    | FeedData
    | FeedSuspended
    | TransactionDataRequest
    | TransactionDataResponse
    | FlushRequest
    | FlushResponse
    | LockFailure
    | HighWaterMarkRequest
    | HighWaterMarkResponse
    | CheckStorageConnectivityRequest
    | CheckStorageConnectivityResponse
    | ServerPartitionsAssignmentRequest
    | ServerPartitionsAssignmentResponse
    | AddPreferredPartitionRequest
    | AddPreferredPartitionResponse
    | RemovePreferredPartitionRequest
    | RemovePreferredPartitionResponse
    | ServerPartitionsHealthStatRequest
    | ServerPartitionsHealthStatResponse
    | AuthorizationFailure
)


def _req_id_to_wire(msg: Any) -> ReqId:
    req_id: ReqId = msg[0]
    return req_id


def _req_id_from_wire(values: Any) -> tuple[ReqId]:
    return (ReqId._make(values),)


HEADER = HeaderLayout("iiii", 1, _req_id_to_wire, _req_id_from_wire)


def verify_checksum(data: bytes | None, checksum: int) -> None:
    if data is None:
        raise InvalidValueError("data is null (length -1), so its checksum cannot be verified")
    actual = crc32(data)
    if actual != checksum:
        raise DataChecksumError(
            f"data checksum mismatch: message says {checksum}, CRC-32 of the data is {actual}"
        )


# -- APPEND_REQUEST (hot: hand-written) --------------------------------------------------------

_APPEND_PREFIX = struct.Struct(">biiiiq")
_APPEND_REQUEST = 2


def _require_empty(locks: tuple[int, ...] | None, field: str, refusal: str) -> None:
    if locks is None:
        raise EncodeError(f"{field} is None; this codec version cannot encode it")
    if locks:
        raise EncodeError(refusal)


def _append_request_spec(version: int) -> MessageSpec:
    with_read_locks = version >= _READ_LOCKS_SINCE_VERSION
    with_append_locks = version >= _APPEND_LOCKS_SINCE_VERSION
    prefix_pack, prefix_unpack, prefix_size = (
        _APPEND_PREFIX.pack,
        _APPEND_PREFIX.unpack_from,
        _APPEND_PREFIX.size,
    )
    i32_pack, i32_unpack = I32.pack, I32.unpack_from

    def write(out: bytearray, msg: AppendRequest) -> None:
        # Same checks and order as the original encoders, so the same messages are refused.
        if not with_read_locks:
            _require_empty(
                msg.read_lock_request, "read_lock_request", "read locks not supported, upgrade servers"
            )
        if not with_append_locks:
            _require_empty(
                msg.append_lock_request, "append_lock_request", "append locks not supported, upgrade servers"
            )
        out += prefix_pack(_APPEND_REQUEST, *msg.req_id, msg.client_high_water_mark)
        write_int_array(out, msg.write_lock_request)
        if with_read_locks:
            write_int_array(out, msg.read_lock_request)
        if with_append_locks:
            write_int_array(out, msg.append_lock_request)
        out += i32_pack(msg.header)
        write_bytes(out, msg.data)
        out += i32_pack(msg.checksum)

    def read(buf: Buffer) -> tuple[AppendRequest, int]:
        _, client_id, generation, partition_id, seq_num, high_water_mark = prefix_unpack(buf, 0)
        write_locks, pos = read_int_array(buf, prefix_size)
        read_locks: tuple[int, ...] | None = NO_LOCKS
        append_locks: tuple[int, ...] | None = NO_LOCKS
        if with_read_locks:
            read_locks, pos = read_int_array(buf, pos)
        if with_append_locks:
            append_locks, pos = read_int_array(buf, pos)
        (header,) = i32_unpack(buf, pos)
        data, pos = read_bytes(buf, pos + INT32_SIZE_BYTES)
        (checksum,) = i32_unpack(buf, pos)
        verify_checksum(data, checksum)
        msg = AppendRequest(
            ReqId(client_id, generation, partition_id, seq_num),
            high_water_mark,
            write_locks,
            read_locks,
            append_locks,
            header,
            data,
            checksum,
        )
        return msg, pos + INT32_SIZE_BYTES

    return MessageSpec(_APPEND_REQUEST, "APPEND_REQUEST", AppendRequest, write, read)


# A whole frame of an APPEND_REQUEST without locks, up to its data (codec versions with the three
# lock arrays): frame header; type, reqId, client high-water mark; three lock counts; header; data
# length. Then the data and the checksum.
_LONE_APPEND_HEAD = struct.Struct(FRAME_HEADER.format + "biiiiq" + "iii" + "ii")
_LONE_APPEND_CHECKSUM = I32
_MASK32 = 0xFFFFFFFF


def recognise_append_request(data: bytes, version: int) -> AppendRequest | None:
    """``data`` as one whole APPEND_REQUEST frame of client codec ``version`` without locks (the
    commonest thing a client says), decoded with one struct, as the codec decodes it; None for
    anything else (another message, locks, a null or wrong-checksum data, a partial frame, more
    than one frame, an older codec), which the frame decoder then judges as before."""
    size = len(data)
    head_size = _LONE_APPEND_HEAD.size
    if version < _APPEND_LOCKS_SINCE_VERSION or size < head_size + INT32_SIZE_BYTES:
        return None
    (
        magic,
        frame_version,
        length,
        type_code,
        client_id,
        generation,
        partition_id,
        seq_num,
        high_water_mark,
        write_locks,
        read_locks,
        append_locks,
        header,
        data_size,
    ) = _LONE_APPEND_HEAD.unpack_from(data, 0)
    end = head_size + data_size
    if (
        magic != CLIENT_MAGIC
        or frame_version != version
        or type_code != _APPEND_REQUEST
        or length != size - FRAME_HEADER_SIZE_BYTES
        or write_locks
        or read_locks
        or append_locks
        or data_size < 0
        or end + INT32_SIZE_BYTES != size
    ):
        return None
    payload = bytes(data[head_size:end])
    (checksum,) = _LONE_APPEND_CHECKSUM.unpack_from(data, end)
    # (``crc32`` inline: the unsigned CRC against the signed field's 32 bits, the same test.)
    if zlib.crc32(payload) != checksum & _MASK32:
        return None  # the decoder refuses it, with its error
    # tuple.__new__ builds the two named tuples without their __new__'s Python call each (as
    # the client's feed decoder does): the same tuples, field for field.
    new = tuple.__new__
    return new(
        AppendRequest,
        (
            new(ReqId, (client_id, generation, partition_id, seq_num)),
            high_water_mark,
            NO_LOCKS,
            NO_LOCKS,
            NO_LOCKS,
            header,
            payload,
            checksum,
        ),
    )


def lone_append_frame(msg: AppendRequest, version: int) -> bytes | None:
    """The whole APPEND_REQUEST frame of client codec ``version`` for ``msg`` without locks (the
    commonest thing a client says), packed with one struct and joined with its data in one
    copy: the same bytes as ``CLIENT_CODECS[version].encode_frame(msg)``. None for anything
    else (locks, a null data, an older codec, a value out of its field's range, a frame over
    the size limit), which the codec then encodes or refuses as before."""
    data = msg.data
    if (
        version < _APPEND_LOCKS_SINCE_VERSION
        or data is None
        or msg.write_lock_request
        or msg.read_lock_request
        or msg.append_lock_request
        or msg.write_lock_request is None
        or msg.read_lock_request is None
        or msg.append_lock_request is None
    ):
        return None
    size = len(data)
    length = _LONE_APPEND_HEAD.size - FRAME_HEADER_SIZE_BYTES + size + INT32_SIZE_BYTES
    if length > MAX_FRAME_SIZE_BYTES:
        return None
    client_id, generation, partition_id, seq_num = msg.req_id
    try:
        head = _LONE_APPEND_HEAD.pack(
            CLIENT_MAGIC,
            version,
            length,
            _APPEND_REQUEST,
            client_id,
            generation,
            partition_id,
            seq_num,
            msg.client_high_water_mark,
            0,
            0,
            0,
            msg.header,
            size,
        )
        checksum = _LONE_APPEND_CHECKSUM.pack(msg.checksum)
    except struct.error:
        return None
    return b"".join((head, data, checksum))


# -- TRANSACTION_DATA_RESPONSE: data or an error message ------------------------------------------

_TRANSACTION_DATA_PREFIX = struct.Struct(">biiiiq?")
_TRANSACTION_DATA_RESPONSE = 7


def _write_transaction_data_response(out: bytearray, msg: TransactionDataResponse) -> None:
    has_data = msg.data is not None
    if has_data and msg.exception_message is not None:
        raise EncodeError("carries both data and exception_message; it must be one or the other")
    if not has_data and msg.checksum != 0:
        raise EncodeError("carries a checksum but no data")
    out += _TRANSACTION_DATA_PREFIX.pack(
        _TRANSACTION_DATA_RESPONSE, *msg.req_id, msg.transaction_id, has_data
    )
    if has_data:
        write_bytes(out, msg.data)
        out += I32.pack(msg.checksum)
    else:
        write_string(out, msg.exception_message)


def _read_transaction_data_response(buf: Buffer) -> tuple[TransactionDataResponse, int]:
    _, client_id, generation, partition_id, seq_num, txid, has_data = _TRANSACTION_DATA_PREFIX.unpack_from(
        buf, 0
    )
    req_id = ReqId(client_id, generation, partition_id, seq_num)
    pos = _TRANSACTION_DATA_PREFIX.size
    if has_data:
        data, pos = read_bytes(buf, pos)
        (checksum,) = I32.unpack_from(buf, pos)
        verify_checksum(data, checksum)
        return TransactionDataResponse(req_id, txid, data, checksum), pos + INT32_SIZE_BYTES
    message, pos = read_string(buf, pos)
    return TransactionDataResponse(req_id, txid, exception_message=message), pos


# -- MOUNT_RESPONSE up to v2: a READY flag ---------------------------------------------------------


def _write_ready_flag(out: bytearray, partition_state: int) -> None:
    out.append(1 if partition_state == PARTITION_STATE_READY else 0)


def _read_ready_flag(buf: Buffer, pos: int) -> tuple[int, int]:
    ready, pos = read_bool(buf, pos)
    return (PARTITION_STATE_READY if ready else PARTITION_STATE_NOT_READY), pos


def _specs(version: int) -> list[MessageSpec]:
    h = HEADER
    specs = [
        fixed_spec(0, "MOUNT_REQUEST", MountRequest, h, "qq"),
        (
            fixed_spec(1, "MOUNT_RESPONSE", MountResponse, h, "i")
            if version >= _INT_STATE_SINCE_VERSION
            else field_spec(
                1, "MOUNT_RESPONSE", MountResponse, h, [Field(_read_ready_flag, _write_ready_flag)]
            )
        ),
        _append_request_spec(version),
        fixed_spec(3, "FEED_REQUEST", FeedRequest, h, "q"),
        fixed_spec(4, "FEED_DATA", FeedData, h, "qi"),
        fixed_spec(5, "FEED_SUSPENDED", FeedSuspended, h, ""),
        fixed_spec(6, "TRANSACTION_DATA_REQUEST", TransactionDataRequest, h, "q"),
        MessageSpec(
            _TRANSACTION_DATA_RESPONSE,
            "TRANSACTION_DATA_RESPONSE",
            TransactionDataResponse,
            _write_transaction_data_response,
            _read_transaction_data_response,
        ),
        fixed_spec(8, "FLUSH_REQUEST", FlushRequest, h, ""),
        fixed_spec(9, "FLUSH_RESPONSE", FlushResponse, h, "q"),
        fixed_spec(10, "LOCK_FAILURE", LockFailure, h, "q"),
        fixed_spec(11, "HIGH_WATER_MARK_REQUEST", HighWaterMarkRequest, h, ""),
        fixed_spec(12, "HIGH_WATER_MARK_RESPONSE", HighWaterMarkResponse, h, "q"),
    ]
    if version >= 1:
        specs += [
            fixed_spec(13, "CHECK_STORAGE_CONNECTIVITY_REQUEST", CheckStorageConnectivityRequest, h, ""),
            field_spec(
                14,
                "CHECK_STORAGE_CONNECTIVITY_RESPONSE",
                CheckStorageConnectivityResponse,
                h,
                [Field(read_str_bool_pairs, write_str_bool_pairs)],
            ),
        ]
    if version >= 2:
        int_list = [Field(read_int_list, write_int_list)]
        specs += [
            fixed_spec(15, "SERVER_PARTITIONS_ASSIGNMENT_REQUEST", ServerPartitionsAssignmentRequest, h, ""),
            field_spec(
                16, "SERVER_PARTITIONS_ASSIGNMENT_RESPONSE", ServerPartitionsAssignmentResponse, h, int_list
            ),
            field_spec(17, "ADD_PREFERRED_PARTITION_REQUEST", AddPreferredPartitionRequest, h, int_list),
            fixed_spec(18, "ADD_PREFERRED_PARTITION_RESPONSE", AddPreferredPartitionResponse, h, "?"),
            field_spec(
                19, "REMOVE_PREFERRED_PARTITION_REQUEST", RemovePreferredPartitionRequest, h, int_list
            ),
            fixed_spec(20, "REMOVE_PREFERRED_PARTITION_RESPONSE", RemovePreferredPartitionResponse, h, "?"),
        ]
    if version >= 4:
        specs += [
            fixed_spec(21, "SERVER_PARTITIONS_HEALTH_STAT_REQUEST", ServerPartitionsHealthStatRequest, h, ""),
            field_spec(
                22,
                "SERVER_PARTITIONS_HEALTH_STAT_RESPONSE",
                ServerPartitionsHealthStatResponse,
                h,
                [Field(read_int_bool_pairs, write_int_bool_pairs)],
            ),
        ]
    if version >= AUTHORIZATION_VERSION:
        i32 = Field(read_i32, write_i32)
        text = Field(read_string, write_string)
        specs.append(field_spec(23, "AUTHORIZATION_FAILURE", AuthorizationFailure, h, [i32, text, i32, text]))
    return specs


def _build_codecs() -> dict[int, MessageCodec[ClientMessage]]:
    specs_by_version = {version: _specs(version) for version in CLIENT_VERSIONS}
    all_names = {s.type_code: s.name for specs in specs_by_version.values() for s in specs}
    return {
        version: MessageCodec(CLIENT_MAGIC, version, specs, all_names)
        for version, specs in specs_by_version.items()
    }


CLIENT_CODECS: dict[int, MessageCodec[ClientMessage]] = _build_codecs()
AUTHORIZING_CLIENT_CODEC: MessageCodec[ClientMessage] = MessageCodec(
    CLIENT_MAGIC,
    AUTHORIZATION_VERSION,
    _specs(AUTHORIZATION_VERSION),
    {s.type_code: s.name for s in _specs(AUTHORIZATION_VERSION)},
)
# The original's versions and ours: what a server with the authorizer on, and a client with a
# certificate, offer.
EXTENDED_CLIENT_CODECS: dict[int, MessageCodec[ClientMessage]] = {
    **CLIENT_CODECS,
    AUTHORIZATION_VERSION: AUTHORIZING_CLIENT_CODEC,
}
