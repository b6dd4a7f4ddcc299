"""The storage node's Record-free append path (``waltz_engine.disk.record_run``): a request's
record bytes become the same segment bytes as ``Record`` objects do, and the data port's
decoder refuses what the record decoder refuses."""

from __future__ import annotations

import random
import struct

import pytest

from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_format import encode_records
from waltz_engine.disk.record_run import JoinedRuns, RecordList, WireRecordRun, read_wire_record_run
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES
from waltz_engine.wire.primitives import I32, read_records, write_records
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    STORAGE_DATA_PORT_CODEC,
    StorageAppendRequest,
    StorageAppendRunRequest,
    StorageSuccessResponse,
    request_name,
    success_frame,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _records(first_txid: int, count: int, rng: random.Random) -> list[Record]:
    """Records with every field at its edges now and then: negative reqId parts and headers,
    empty data, signed checksums."""
    records = []
    for i in range(count):
        req = ReqId(
            *(
                rng.choice([INT32_MIN, -1, 0, 1, INT32_MAX, rng.randint(INT32_MIN, INT32_MAX)])
                for _ in range(4)
            )
        )
        data = rng.randbytes(rng.choice([0, 1, 37, 512]))
        checksum = rng.randint(INT32_MIN, INT32_MAX)
        records.append(Record(first_txid + i, req, rng.randint(INT32_MIN, INT32_MAX), data, checksum))
    return records


def _end_within(sizes: list[int], start: int, room_bytes: int) -> int:
    """What a segment took before the runs: record by record until one passes the room."""
    end, used = start, 0
    while end < len(sizes):
        used += sizes[end]
        end += 1
        if used > room_bytes:
            break
    return end


def _run(records: list[Record]) -> WireRecordRun:
    out = bytearray(b"xyz")  # the record list starts anywhere in the payload
    write_records(out, records)
    run, end = read_wire_record_run(bytes(out), 3)
    assert end == len(out)
    return run


@pytest.mark.parametrize("count", [0, 1, 2, 33])
def test_a_wire_run_encodes_the_same_segment_bytes_as_its_records(count: int) -> None:
    rng = random.Random(count)
    records = _records(1000, count, rng)
    run = _run(records)
    assert len(run) == count and run.records() == tuple(records)
    assert run.consecutive_from(1000) and (count == 0 or not run.consecutive_from(1001))
    for start in range(count + 1):
        for end in range(start, count + 1):
            assert run.encode(start, end, 128 + start) == encode_records(records[start:end], 128 + start)
            assert RecordList(records).encode(start, end, 7) == encode_records(records[start:end], 7)
    for i, record in enumerate(records):
        assert run.transaction_id(i) == record.transaction_id
        for room in (-1, 0, 39, 40 + len(record.data), 600, 2000, 10**9):
            expected = _end_within([40 + len(r.data) for r in records], i, room)
            assert run.end_within(i, room) == RecordList(records).end_within(i, room) == expected


def test_joined_runs_are_their_records_in_order() -> None:
    rng = random.Random(7)
    records = _records(5, 9, rng)
    parts = [records[:4], [], records[4:5], records[5:]]
    joined = JoinedRuns([_run(part) for part in parts])
    assert len(joined) == 9 and joined.consecutive_from(5) and not joined.consecutive_from(6)
    assert [joined.transaction_id(i) for i in range(9)] == list(range(5, 14))
    sizes = [40 + len(r.data) for r in records]
    for start in range(9):
        for room in range(-1, sum(sizes) + 2, 37):
            assert joined.end_within(start, room) == _end_within(sizes, start, room)
    for start in range(10):
        for end in range(start, 10):
            assert joined.encode(start, end, 999) == encode_records(records[start:end], 999)
    gap = JoinedRuns([_run(records[:4]), _run(records[5:])])
    assert not gap.consecutive_from(5)


def test_txids_out_of_order_within_a_run_are_seen() -> None:
    records = _records(0, 3, random.Random(1))
    swapped = [records[0], records[2], records[1]]
    assert not _run(swapped).consecutive_from(0)
    assert not RecordList(swapped).consecutive_from(0)


@pytest.mark.parametrize(
    "damage",
    ["negative count", "count past the payload", "negative length", "length past the payload"],
)
def test_the_run_decoder_refuses_what_the_record_decoder_refuses(damage: str) -> None:
    out = bytearray()
    write_records(out, _records(0, 2, random.Random(2)))
    if damage == "negative count":
        I32.pack_into(out, 0, -1)
    elif damage == "count past the payload":
        I32.pack_into(out, 0, 3)
    elif damage == "negative length":
        I32.pack_into(out, 4 + 28, -5)
    else:
        I32.pack_into(out, 4 + 28, 10_000)
    payload = bytes(out)
    # (struct.error: a run cut short; the codec names it a truncated message for both.)
    with pytest.raises((ProtocolError, struct.error)) as theirs:
        read_records(payload, 0)
    with pytest.raises(type(theirs.value)) as ours:
        read_wire_record_run(payload, 0)
    assert str(ours.value) == str(theirs.value)


def test_the_success_frame_is_the_codecs() -> None:
    for values in [(0, 0, 0), (-1, -1, -1), (2**63 - 1, -(2**63), INT32_MAX), (7, 12345, 3)]:
        assert success_frame(*values) == STORAGE_CODEC.encode_frame(StorageSuccessResponse(*values))


def test_operators_see_the_append_by_its_message_name() -> None:
    out = bytearray()
    write_records(out, _records(0, 1, random.Random(3)))
    frame = STORAGE_CODEC.encode_frame(StorageAppendRequest(1, 2, 3, read_records(bytes(out), 0)[0], False))
    msg = STORAGE_DATA_PORT_CODEC.decode(frame[FRAME_HEADER_SIZE_BYTES:])
    assert type(msg) is StorageAppendRunRequest
    assert request_name(msg) == "StorageAppendRequest"
    assert request_name(StorageSuccessResponse(1, 2, 3)) == "StorageSuccessResponse"
