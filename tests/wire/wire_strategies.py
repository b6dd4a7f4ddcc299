"""Hypothesis strategies for valid messages of every codec version."""

from __future__ import annotations

import os
import uuid
from typing import Any

from hypothesis import strategies as st

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    AppendRequest,
    MountResponse,
    TransactionDataResponse,
)
from waltz_engine.wire.codec import MessageCodec, MessageSpec
from waltz_engine.wire.codecs import ALL_CODECS, AnyCodec
from waltz_engine.wire.hello import Hello, java_hash_set_order
from waltz_engine.wire.primitives import SessionInfo, StackFrame, StorageRpcException

# Raise for a long fuzzing run, e.g. WALTZ_FUZZ_EXAMPLES=100000 pytest tests/wire -k fuzz
FUZZ_EXAMPLES = int(os.environ.get("WALTZ_FUZZ_EXAMPLES", "60"))
ROUND_TRIP_EXAMPLES = int(os.environ.get("WALTZ_ROUND_TRIP_EXAMPLES", "30"))
MAX_LIST_ITEMS = 5
MAX_DATA_BYTES = 64

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
data_bytes = st.binary(max_size=MAX_DATA_BYTES)
text = st.text(max_size=20)
optional_text = st.none() | text
int_tuple = st.lists(int32, max_size=MAX_LIST_ITEMS).map(tuple)
optional_int_tuple = st.none() | int_tuple
req_ids = st.builds(ReqId, int32, int32, int32, int32)
records = st.builds(Record, int64, req_ids, int32, data_bytes, int32)
record_headers = st.builds(RecordHeader, int64, req_ids, int32)
stack_frames = st.builds(StackFrame, optional_text, optional_text, optional_text, int32)
rpc_exceptions = st.builds(StorageRpcException, optional_text, st.lists(stack_frames, max_size=3).map(tuple))

_BY_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "req_id": req_ids,
    "client_high_water_mark": int64,
    "seq_num": int64,
    "session_id": int64,
    "transaction_id": int64,
    "low_water_mark": int64,
    "partition_id": int32,
    "partition_state": int32,
    "num_partitions": int32,
    "max_num_records": int32,
    "header": int32,
    "checksum": int32,
    "used_by_offline_recovery": st.booleans(),
    "result": st.booleans(),
    "toggled": st.booleans(),
    "delete_storage_files": st.booleans(),
    "key": st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1)),
    "last_session_info": st.builds(SessionInfo, int64, int64, int64),
    "records": st.lists(records, max_size=MAX_LIST_ITEMS).map(tuple),
    "record": st.none() | records,
    "record_header": st.none() | record_headers,
    "record_headers": st.lists(record_headers, max_size=MAX_LIST_ITEMS).map(tuple),
    "exception": rpc_exceptions,
    "metrics_json": optional_text,
    "server_partition_assignments": int_tuple,
    "storage_connectivity_map": st.lists(st.tuples(optional_text, st.booleans()), max_size=4).map(tuple),
    "server_partition_health_stats": st.lists(st.tuples(int32, st.booleans()), max_size=4).map(tuple),
    "partition_status_map": st.lists(st.tuples(int32, st.booleans()), max_size=4).map(tuple),
}


@st.composite
def _append_requests(draw: st.DrawFn, version: int) -> AppendRequest:
    data = draw(data_bytes)
    return AppendRequest(
        draw(req_ids),
        draw(int64),
        draw(optional_int_tuple),
        draw(optional_int_tuple) if version >= 1 else (),
        draw(optional_int_tuple) if version >= 2 else (),
        draw(int32),
        data,
        crc32(data),
    )


@st.composite
def _transaction_data_responses(draw: st.DrawFn) -> TransactionDataResponse:
    if draw(st.booleans()):
        data = draw(data_bytes)
        return TransactionDataResponse(draw(req_ids), draw(int64), data, crc32(data))
    return TransactionDataResponse(draw(req_ids), draw(int64), exception_message=draw(optional_text))


def _hellos() -> st.SearchStrategy[Hello]:
    # Decoding orders versions as Java's HashSet; generate them in that order to compare.
    versions = st.lists(int16, max_size=8).map(java_hash_set_order)
    return st.builds(Hello, versions, optional_text)


def message_strategy(codec: AnyCodec, spec: MessageSpec | None) -> st.SearchStrategy[Any]:
    if spec is None:
        return _hellos()
    if spec.cls is AppendRequest:
        return _append_requests(codec.version)
    if spec.cls is TransactionDataResponse:
        return _transaction_data_responses()
    overrides: dict[str, st.SearchStrategy[Any]] = {
        # Only the admin codec's id lists have a null form.
        "partition_ids": optional_int_tuple if codec.magic == ord("A") else int_tuple,
    }
    if spec.cls is MountResponse and codec.version < 3:
        overrides["partition_state"] = st.sampled_from([PARTITION_STATE_READY, PARTITION_STATE_NOT_READY])
    fields = {name: overrides[name] if name in overrides else _BY_FIELD[name] for name in spec.cls._fields}
    return st.builds(spec.cls, **fields)


def every_message_kind() -> list[tuple[AnyCodec, MessageSpec | None]]:
    kinds: list[tuple[AnyCodec, MessageSpec | None]] = []
    for codec in ALL_CODECS:
        if isinstance(codec, MessageCodec):
            kinds += [(codec, spec) for spec in codec.specs]
        else:
            kinds.append((codec, None))
    return kinds


def kind_id(kind: tuple[AnyCodec, MessageSpec | None]) -> str:
    codec, spec = kind
    return f"{codec.label.replace(' ', '')}-{spec.name if spec else 'HELLO'}"
