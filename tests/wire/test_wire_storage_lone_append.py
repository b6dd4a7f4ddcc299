"""The storage node's lone append reads its bytes in fewer steps (issue 33): a frame read whole is
cut with one unpack (``FrameDecoder.whole_payload``) and an APPEND_REQUEST of one record is read
with one unpack (the data port codec's reader). Each must give what the general path gives, the
same message or the same error, whatever the bytes: these compare the two on valid, cut, grown
and flipped inputs."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import FUZZ_EXAMPLES

from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_run import read_wire_record_run, write_wire_record_run
from waltz_engine.wire.codec import Field, MessageCodec, field_spec
from waltz_engine.wire.frame import FRAME_HEADER, FrameDecoder
from waltz_engine.wire.primitives import read_bool, write_bool
from waltz_engine.wire.storage_messages import (
    APPEND_REQUEST_TYPE,
    HEADER,
    STORAGE_CODEC,
    STORAGE_DATA_PORT_CODEC,
    STORAGE_MAGIC,
    STORAGE_VERSION,
    StorageAppendRequest,
    StorageAppendRunRequest,
    read_whole_append,
)

FUZZ = settings(max_examples=FUZZ_EXAMPLES * 5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Where a one-record APPEND_REQUEST holds its data length (type, header, count, then 28 bytes
# of the record before it).
DATA_LENGTH_OFFSET = 1 + 8 + 8 + 4 + 4 + 28

# The data port's APPEND_REQUEST through the codec's general field readers only.
_GENERAL_APPEND = field_spec(
    APPEND_REQUEST_TYPE,
    "APPEND_REQUEST",
    StorageAppendRunRequest,
    HEADER,
    [Field(read_wire_record_run, write_wire_record_run), Field(read_bool, write_bool)],
)
GENERAL = MessageCodec(
    STORAGE_MAGIC,
    STORAGE_VERSION,
    [_GENERAL_APPEND if s.type_code == APPEND_REQUEST_TYPE else s for s in STORAGE_DATA_PORT_CODEC.specs],
)


def _outcome(codec: MessageCodec[Any], payload: bytes | memoryview) -> tuple[Any, ...]:
    try:
        msg = codec.decode(payload)
    except ProtocolError as e:
        return ("error", type(e), str(e))
    return _described(msg)


def _described(msg: Any) -> tuple[Any, ...]:
    run = msg.records
    return (
        "message",
        msg.session_id,
        msg.seq_num,
        msg.partition_id,
        run.txids,
        run.starts,
        run.wire_bytes(),
        run.consecutive_from(run.txids[0]) if run.txids else None,
        msg.used_by_offline_recovery,
        type(msg.used_by_offline_recovery),
    )


def _damaged(
    payload: bytearray, flips: list[tuple[int, int]], cut: int, tail: bytes, as_view: bool
) -> bytes | memoryview:
    """``payload`` with bytes flipped, then cut short by ``cut`` bytes, then grown by ``tail``."""
    for where, byte in flips:
        payload[where % len(payload)] = byte
    if cut:
        del payload[max(0, len(payload) - cut) :]
    payload += tail
    return memoryview(bytes(payload)) if as_view else bytes(payload)


records_strategy = st.lists(
    st.builds(
        Record,
        st.integers(-(2**63), 2**63 - 1),
        st.builds(ReqId, st.integers(-(2**31), 2**31 - 1), st.just(2), st.just(3), st.just(4)),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=40),
        st.integers(-(2**31), 2**31 - 1),
    ),
    max_size=3,
)


@FUZZ
@given(
    records=st.one_of(records_strategy, records_strategy.filter(lambda r: len(r) == 1)),
    flag=st.booleans(),
    cut=st.one_of(st.just(0), st.integers(1, 200)),
    tail=st.one_of(st.just(b""), st.binary(min_size=1, max_size=6)),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    length=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.integers(-8, 8)),
    flag_byte=st.one_of(st.none(), st.integers(0, 255)),
    as_view=st.booleans(),
)
def test_the_one_record_reader_reads_as_the_general_one(
    records: list[Record],
    flag: bool,
    cut: int,
    tail: bytes,
    flips: list[tuple[int, int]],
    length: int | None,
    flag_byte: int | None,
    as_view: bool,
) -> None:
    payload = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, tuple(records), flag)))
    if length is not None and len(payload) >= DATA_LENGTH_OFFSET + 4:
        # A data length that lies (around the true one when small: off by a few bytes).
        true_length = len(payload) - DATA_LENGTH_OFFSET - 4 - 4 - 1
        value = true_length + length if -8 <= length <= 8 else length
        struct.pack_into(">i", payload, DATA_LENGTH_OFFSET, max(-(2**31), min(2**31 - 1, value)))
    if flag_byte is not None:
        payload[-1] = flag_byte  # (any non-zero byte is true)
    data = _damaged(payload, flips, cut, tail, as_view)
    assert _outcome(STORAGE_DATA_PORT_CODEC, data) == _outcome(GENERAL, data)


@FUZZ
@given(stream=st.binary(max_size=80), prefix=st.binary(max_size=9), frame_length=st.integers(-2, 80))
def test_a_whole_frame_is_cut_as_the_decoder_cuts_it(stream: bytes, prefix: bytes, frame_length: int) -> None:
    # Mostly a plausible header: this codec's magic and version, a length near the bytes that follow.
    data = FRAME_HEADER.pack(ord("S"), 0, frame_length) + stream if not prefix else prefix + stream
    whole = FrameDecoder(ord("S"), 0, max_frame_size_bytes=64)
    general = FrameDecoder(ord("S"), 0, max_frame_size_bytes=64)
    payload = whole.whole_payload(data)
    try:
        frames = general.feed(data)
    except ProtocolError:
        assert payload is None
        return
    if payload is not None:
        assert [f.payload for f in frames] == [payload]
        assert general.buffered_bytes == 0
    assert whole.buffered_bytes == 0  # (it takes nothing it does not return)


def test_a_valid_one_record_append_reads_as_before() -> None:
    for data in (b"", b"x", b"data" * 128):
        record = Record(2**40 + 3, ReqId(-1, 2, 3, 4), -7, data, 12345)
        payload = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(2**50, -1, 9, (record,), False)))
        for flag_byte in (0, 1, 2, 255):
            payload[-1] = flag_byte
            for given_as in (bytes(payload), memoryview(bytes(payload))):
                outcome = _outcome(STORAGE_DATA_PORT_CODEC, given_as)
                assert outcome == _outcome(GENERAL, given_as)
                assert outcome[0] == "message" and outcome[-2] == (flag_byte != 0)


def test_a_negative_data_length_is_refused_as_before() -> None:
    # A payload that would end right after the record if a negative length were taken (too
    # short for a record: refused, as the general reader refuses it).
    payload = bytearray(
        STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, (Record(9, ReqId(1, 2, 3, 4), 0, b"", 0),), False))
    )
    for length in (-1, -2, -3):
        short = bytearray(payload[: len(payload) + length])
        struct.pack_into(">i", short, DATA_LENGTH_OFFSET, length)
        outcome = _outcome(STORAGE_DATA_PORT_CODEC, bytes(short))
        assert outcome == _outcome(GENERAL, bytes(short))
        assert outcome[0] == "error"


def test_a_whole_frame_is_not_taken_behind_buffered_bytes() -> None:
    frame = FRAME_HEADER.pack(ord("S"), 0, 3) + b"abc"
    decoder = FrameDecoder(ord("S"), 0)
    assert decoder.whole_payload(frame) == b"abc"
    assert decoder.feed(frame[:2]) == []
    assert decoder.whole_payload(frame) is None  # (the decoder's two bytes come first)
    assert decoder.whole_payload(FRAME_HEADER.pack(ord("S"), 0, 0)) is None  # a keep-alive


# Where an APPEND_REQUEST holds its record count (after the type and the header).
COUNT_OFFSET = 1 + 8 + 8 + 4
# A wire record's bytes before its data (txid, reqId, header, data length).
RECORD_PREFIX_BYTES = 32


def _whole_append_outcome(payload: bytes | memoryview) -> tuple[Any, ...] | None:
    """What ``read_whole_append`` gives, in ``_outcome``'s shape (None: it leaves the payload
    to the general readers)."""
    msg = read_whole_append(payload)
    return None if msg is None else _described(msg)


several_records = st.lists(
    st.builds(
        Record,
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 6)),
        st.builds(ReqId, st.integers(-(2**31), 2**31 - 1), st.just(2), st.just(3), st.just(4)),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=24),
        st.integers(-(2**31), 2**31 - 1),
    ),
    min_size=2,
    max_size=5,
)


@FUZZ
@given(
    records=st.one_of(
        several_records,
        several_records.map(lambda rs: [r._replace(transaction_id=9 + i) for i, r in enumerate(rs)]),
    ),
    flag=st.booleans(),
    count=st.one_of(st.none(), st.integers(-3, 8), st.integers(-(2**31), 2**31 - 1)),
    lie=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(-40, 40))),
    cut=st.one_of(st.just(0), st.integers(1, 120)),
    tail=st.one_of(st.just(b""), st.binary(min_size=1, max_size=40)),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2),
    as_view=st.booleans(),
)
def test_the_reader_of_several_records_reads_as_the_general_one(
    records: list[Record],
    flag: bool,
    count: int | None,
    lie: tuple[int, int] | None,
    cut: int,
    tail: bytes,
    flips: list[tuple[int, int]],
    as_view: bool,
) -> None:
    """Requests of 2-5 records (16 active partitions), with a count that lies (too few, too
    many, negative, huge), a data length that lies in one record, cut, grown and flipped: the
    data port codec gives what the general readers give, and ``read_whole_append`` the same
    message or nothing."""
    payload = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, tuple(records), flag)))
    if count is not None:
        struct.pack_into(">i", payload, COUNT_OFFSET, count)
    if lie is not None:
        which, delta = lie
        which %= len(records)
        at = COUNT_OFFSET + 4 + sum(RECORD_PREFIX_BYTES + len(r.data) + 4 for r in records[:which])
        true_length = len(records[which].data)
        struct.pack_into(">i", payload, at + RECORD_PREFIX_BYTES - 4, true_length + delta)
    data = _damaged(payload, flips, cut, tail, as_view)
    general = _outcome(GENERAL, data)
    assert _outcome(STORAGE_DATA_PORT_CODEC, data) == general
    whole = _whole_append_outcome(data)
    assert whole is None or whole == general


def test_valid_requests_of_several_records_are_read_in_one_pass() -> None:
    """A valid request of 1-5 records is taken by ``read_whole_append`` (not left to the general
    readers), consecutive txids or not, and reads as they read it."""
    for size in range(1, 6):
        for first, step in ((2**40, 1), (7, 2)):
            records = tuple(Record(first + i * step, ReqId(1, 2, 3, i), i, b"d" * i, 99) for i in range(size))
            payload = STORAGE_CODEC.encode(StorageAppendRequest(2**50, -1, 9, records, True))
            msg = read_whole_append(payload)
            assert msg is not None and list(msg.records.txids) == [r.transaction_id for r in records]
            assert msg.records.consecutive_from(first) == (step == 1 or size == 1)
            assert msg.records.records() == records
            assert _whole_append_outcome(payload) == _outcome(GENERAL, payload)


def test_wrong_counts_and_other_types_are_left_to_the_general_readers() -> None:
    records = tuple(Record(5 + i, ReqId(1, 2, 3, i), 0, b"xy", 1) for i in range(3))
    payload = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, records, False)))
    for count in (0, 1, 2, 4, 5, -1, 2**31 - 1):
        lying = bytearray(payload)
        struct.pack_into(">i", lying, COUNT_OFFSET, count)
        assert read_whole_append(bytes(lying)) is None
        assert _outcome(STORAGE_DATA_PORT_CODEC, bytes(lying))[0] == "error"
    one = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, records[:1], False)))
    struct.pack_into(">i", one, COUNT_OFFSET, 0)  # (no records, then a flag and trailing bytes)
    assert read_whole_append(bytes(one)) is None
    assert _outcome(STORAGE_DATA_PORT_CODEC, bytes(one))[0] == "error"
    other = bytearray(payload)
    other[0] = APPEND_REQUEST_TYPE + 1  # (a SUCCESS_RESPONSE's type: not an append)
    assert read_whole_append(bytes(other)) is None
    assert read_whole_append(bytes(payload[:40])) is None


def test_a_lying_length_or_count_that_lines_the_end_up_is_refused_as_before() -> None:
    """The cases a one-pass reader gets wrong most easily, each made to look whole: a negative
    data length in a later record with the payload cut to end where it would then end, and a
    count one too high with 0-40 bytes after the last record (a record's prefix cut anywhere)."""
    records = tuple(Record(5 + i, ReqId(1, 2, 3, i), 0, b"xy", 1) for i in range(2))
    payload = bytearray(STORAGE_CODEC.encode(StorageAppendRequest(5, 7, 3, records, False)))
    second_length_at = COUNT_OFFSET + 4 + (RECORD_PREFIX_BYTES + 2 + 4) + RECORD_PREFIX_BYTES - 4
    for length in (-1, -2, -6, -40):
        lying = bytearray(payload)
        struct.pack_into(">i", lying, second_length_at, length)
        del lying[len(lying) - (2 - length) :]  # (ends where the lying length says it ends)
        assert read_whole_append(bytes(lying)) is None
        assert _outcome(STORAGE_DATA_PORT_CODEC, bytes(lying))[0] == "error"
    for extra in range(41):
        grown = bytearray(payload) + bytes(range(extra))
        struct.pack_into(">i", grown, COUNT_OFFSET, 3)
        outcome = _outcome(STORAGE_DATA_PORT_CODEC, bytes(grown))
        assert outcome == _outcome(GENERAL, bytes(grown))
        assert _whole_append_outcome(bytes(grown)) in (None, outcome)
