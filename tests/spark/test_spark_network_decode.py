"""The columnar decoder of RECORD_LIST answers (spark.network.decode_batch) against the
original's record encoding: same rows as one Record each, and bad answers refused."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from spark.network import decode_batch, records_batch
from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage.network_reader import BadRecordsError, decode_records
from waltz_engine.wire.primitives import write_records

PARTITION = 3
# What decoding a refused answer of a few bytes may allocate at most.
REFUSAL_MAX_BYTES = 1 << 20


def _records(first: int, sizes: list[int]) -> list[Record]:
    out = []
    for k, size in enumerate(sizes):
        txid = first + k
        data = bytes((txid + i) % 256 for i in range(size))
        out.append(Record(txid, ReqId(7, 2, PARTITION, 100 + k), k - 1, data, crc32(data)))
    return out


def _payload(records: list[Record]) -> memoryview:
    out = bytearray()
    write_records(out, records)
    return memoryview(bytes(out))


# [20, 10, 30]: mixed sizes whose total is the first record's size times the count.
@pytest.mark.parametrize("sizes", [[100] * 50, [0, 5, 300, 1, 0, 64], [0] * 3, [17], [20, 10, 30]])
def test_the_batch_is_what_one_record_each_gives(sizes: list[int]) -> None:
    records = _records(40, sizes)
    batch, count = decode_batch(_payload(records), 40, PARTITION)
    assert count == len(records)
    assert batch.equals(records_batch(PARTITION, records))
    assert decode_records(_payload(records), 40, PARTITION)[0] == records


def test_an_empty_answer_is_an_empty_batch() -> None:
    batch, count = decode_batch(_payload([]), 0, PARTITION)
    assert (batch.num_rows, count) == (0, 0)


def test_a_wrong_data_checksum_is_refused() -> None:
    records = _records(0, [100] * 10)
    records[6] = records[6]._replace(checksum=records[6].checksum ^ 1)
    with pytest.raises(BadRecordsError, match="checksum mismatch"):
        decode_batch(_payload(records), 0, PARTITION)


def test_a_flipped_data_byte_is_refused() -> None:
    raw = bytearray(_payload(_records(0, [10, 20, 30])))
    raw[4 + 36 + 10 + 32 + 3] ^= 0x40  # a data byte of the second record
    with pytest.raises(BadRecordsError, match="checksum mismatch"):
        decode_batch(memoryview(bytes(raw)), 0, PARTITION)


def test_a_record_out_of_order_is_refused() -> None:
    with pytest.raises(BadRecordsError, match="expected transaction 5, got 6"):
        decode_batch(_payload(_records(6, [8, 8])), 5, PARTITION)


def test_a_cut_answer_is_refused() -> None:
    raw = bytes(_payload(_records(0, [10, 20, 30])))
    with pytest.raises(BadRecordsError):
        decode_batch(memoryview(raw[:-3]), 0, PARTITION)


@pytest.mark.parametrize("body_bytes", [0, 10, 100])
def test_a_forged_count_is_refused_before_it_sizes_anything(body_bytes: int) -> None:
    """A count no answer of that size can hold (a hostile or broken node) is refused from the
    answer's size: it sized an array of offsets first (16 GiB for 2^31 - 1 records)."""
    forged = memoryview(struct.pack(">i", 2**31 - 1) + bytes(body_bytes))
    tracemalloc.start()
    try:
        with pytest.raises(BadRecordsError):
            decode_batch(forged, 0, PARTITION)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < REFUSAL_MAX_BYTES
