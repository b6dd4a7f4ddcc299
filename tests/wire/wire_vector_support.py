"""Turn the golden vectors' Java-named JSON into this package's message objects."""

from __future__ import annotations

import re
import uuid
from typing import Any

from testkit import read_jsonl, vectors_dir

from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    MountResponse,
)
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.codecs import AnyCodec, codec_for
from waltz_engine.wire.hello import Hello, HelloCodec
from waltz_engine.wire.primitives import SessionInfo, StackFrame, StorageRpcException

WIRE_FILES = ("client_server_L", "storage_S", "storage_admin_A", "hello_H", "keepalive")


def wire_lines(stem: str) -> list[dict[str, Any]]:
    return read_jsonl(vectors_dir() / "wire" / f"{stem}.jsonl")


def all_wire_lines() -> list[dict[str, Any]]:
    return [line for stem in WIRE_FILES for line in wire_lines(stem)]


def line_id(line: dict[str, Any]) -> str:
    return f"{line['codec']}{line['version']}-{line['name']}-{line['variant']}"


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _req_id(v: dict[str, Any]) -> ReqId:
    return ReqId(v["clientId"], v["generation"], v["partitionId"], v["seqNum"])


def _record(v: dict[str, Any]) -> Record:
    return Record(
        v["transactionId"], _req_id(v["reqId"]), v["header"], bytes.fromhex(v["data"]), v["checksum"]
    )


def _record_header(v: dict[str, Any]) -> RecordHeader:
    return RecordHeader(v["transactionId"], _req_id(v["reqId"]), v["header"])


def _optional(convert: Any) -> Any:
    return lambda v: None if v is None else convert(v)


def _int_tuple(v: list[int] | None) -> tuple[int, ...] | None:
    return None if v is None else tuple(v)


def _pairs(v: list[list[Any]]) -> tuple[tuple[Any, bool], ...]:
    return tuple((k, b) for k, b in v)


def _exception(v: dict[str, Any]) -> StorageRpcException:
    frames = tuple(
        StackFrame(f["className"], f["methodName"], f["fileName"], f["lineNumber"]) for f in v["stackTrace"]
    )
    return StorageRpcException(v["message"], frames)


_CONVERTERS: dict[str, Any] = {
    "req_id": _req_id,
    "data": lambda v: None if v is None else bytes.fromhex(v),
    "write_lock_request": _int_tuple,
    "read_lock_request": _int_tuple,
    "append_lock_request": _int_tuple,
    "partition_ids": _int_tuple,
    "server_partition_assignments": _int_tuple,
    "versions": tuple,
    "storage_connectivity_map": _pairs,
    "server_partition_health_stats": _pairs,
    "partition_status_map": _pairs,
    "key": lambda v: uuid.UUID(v["uuid"]),
    "last_session_info": lambda v: SessionInfo(v["sessionId"], v["lowWaterMark"], v["localLowWaterMark"]),
    "records": lambda v: tuple(_record(r) for r in v),
    "record": _optional(_record),
    "record_header": _optional(_record_header),
    "record_headers": lambda v: tuple(_record_header(r) for r in v),
    "exception": _exception,
}


def codec_of(line: dict[str, Any]) -> AnyCodec:
    return codec_for(int(line["magic_hex"], 16), line["version"])


def message_from_fields(line: dict[str, Any]) -> Any:
    """The message the Java driver built, from the line's ``fields``."""
    codec = codec_of(line)
    if isinstance(codec, HelloCodec):
        cls: Any = Hello
    else:
        assert isinstance(codec, MessageCodec)
        spec = codec.spec_for_type(line["type"])
        if spec is None:
            # The type is not in this version: take the class from a version that has it.
            spec = codec_for(codec.magic, 4 if codec.magic == ord("L") else codec.version).spec_for_type(
                line["type"]
            )
        assert spec is not None
        cls = spec.cls
    values = {snake(k): _CONVERTERS.get(snake(k), lambda v: v)(v) for k, v in line["fields"].items()}
    return cls(**values)


def expected_decoded(line: dict[str, Any]) -> Any:
    """What decoding the line's frame must give: the fields, as the original's decoder reads them back."""
    msg = message_from_fields(line)
    if isinstance(msg, MountResponse) and line["version"] < 3:
        # v0-v2 carry only "is READY"; the decoder turns false into NOT_READY.
        ready = msg.partition_state == PARTITION_STATE_READY
        return msg._replace(partition_state=PARTITION_STATE_READY if ready else PARTITION_STATE_NOT_READY)
    if line["codec"] == "L" and line["name"] == "APPEND_REQUEST" and line["version"] < 2:
        # Lock arrays a version does not carry decode as empty.
        msg = msg._replace(append_lock_request=())
        if line["version"] == 0:
            msg = msg._replace(read_lock_request=())
    return msg
