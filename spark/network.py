"""Records read over the network (:mod:`waltz_engine.storage.network_reader`) as Arrow batches of
:data:`spark.schema.ARROW_SCHEMA`, and the one function every reader of a slice calls.

A RECORD_LIST answer's record list is parsed by columns, as :mod:`spark.segments` parses a
segment's data, with the same kernels: the answer's bytes are wrapped without a copy as an
Arrow array of whole records, ``binary_slice`` cuts out the headers, data and checksums, and
every data checksum is checked by one ``zlib.crc32`` over the data fields
(:func:`waltz_engine.disk.record_columns.chunk_crcs_match`: on the wire each record's data is followed by its
checksum, as on disk a record is followed by its CRC). Only where each record starts is found
record by record, and only when the records' data lengths differ.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark.schema import ARROW_SCHEMA
from spark.segments import SegmentSlice, fixed_width_values, read_slice, record_batch
from spark.tier import SourceCounts, TierSlice, read_tier_slice
from waltz_engine.common.record import Record
from waltz_engine.disk.record_columns import SHARED_HEAD_FIELDS, chunk_crcs_match, zeroed_crcs_ok
from waltz_engine.storage.network_reader import BadRecordsError, NetworkSlice, read_slice_runs

# A record on the wire (the original's Record.writeTo): txid, the ReqId's four ints, header,
# then the data as an int32 length and its bytes, then the data's CRC32; all big-endian.
_WIRE_HEAD_DTYPE = np.dtype(SHARED_HEAD_FIELDS)
WIRE_HEAD_BYTES = _WIRE_HEAD_DTYPE.itemsize
CHECKSUM_BYTES = 4
WIRE_OVERHEAD_BYTES = WIRE_HEAD_BYTES + CHECKSUM_BYTES
COUNT_BYTES = 4
_LENGTH_OFFSET: int = _WIRE_HEAD_DTYPE.fields["length"][1]  # type: ignore[index]  # a structured dtype has fields
_I32 = struct.Struct(">i")
_CHECKSUM_DTYPE = np.dtype(">u4")


def _record_offsets(body: memoryview, count: int) -> np.ndarray:
    """Where each of ``count`` records starts in ``body``, and where the last one ends.

    Records of one size (the usual case) are checked at once with a strided view of their
    length fields; otherwise the lengths are followed one record at a time."""
    size = len(body)
    if count and size >= WIRE_OVERHEAD_BYTES:
        (length,) = _I32.unpack_from(body, _LENGTH_OFFSET)
        stride = WIRE_OVERHEAD_BYTES + length
        if length >= 0 and stride * count == size:
            lengths = np.ndarray((count,), dtype=">i4", buffer=body, offset=_LENGTH_OFFSET, strides=(stride,))
            if bool((lengths == length).all()):
                return np.arange(0, size + 1, stride, dtype=np.int64)
    offsets = np.empty(count + 1, dtype=np.int64)
    pos = 0
    unpack_from = _I32.unpack_from
    for k in range(count):
        offsets[k] = pos
        if pos + WIRE_OVERHEAD_BYTES > size:
            raise BadRecordsError(f"record {k} of {count} is cut short ({size} bytes in all)")
        (length,) = unpack_from(body, pos + _LENGTH_OFFSET)
        if length < 0:
            raise BadRecordsError(f"record {k} of {count} has a negative data length")
        pos += WIRE_OVERHEAD_BYTES + length
    if pos != size:
        raise BadRecordsError(f"{count} records take {pos} bytes, the answer has {size}")
    offsets[count] = pos
    return offsets


def decode_batch(payload: memoryview, first: int, partition_id: int) -> tuple[pa.RecordBatch, int]:
    """A RECORD_LIST answer's record list as one checked Arrow batch, and its record count
    (a :data:`~waltz_engine.storage.network_reader.RecordDecoder`)."""
    if len(payload) < COUNT_BYTES:
        raise BadRecordsError("the record list has no count")
    (count,) = _I32.unpack_from(payload, 0)
    if count < 0:
        raise BadRecordsError(f"negative record count {count}")
    if count == 0:
        return _empty(), 0
    body = payload[COUNT_BYTES:]
    if count > len(body) // WIRE_OVERHEAD_BYTES:
        # Before sizing anything by it: a forged count would size the offsets (8 bytes a record).
        raise BadRecordsError(f"{count} records cannot fit in {len(body)} bytes")
    offsets = _record_offsets(body, count)
    stride = int(offsets[1])
    if bool((np.diff(offsets) == stride).all()):  # records of one size (the usual case): a matrix
        return _decode_matrix(body, first, partition_id, count, stride), count
    records = pa.Array.from_buffers(
        pa.large_binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )
    heads = fixed_width_values(pc.binary_slice(records, 0, WIRE_HEAD_BYTES), _WIRE_HEAD_DTYPE, count)
    txids = np.arange(first, first + count, dtype=np.int64)
    if not np.array_equal(heads["transaction_id"], txids):
        wrong = int(np.flatnonzero(heads["transaction_id"] != txids)[0])
        raise BadRecordsError(
            f"partition {partition_id}: expected transaction {first + wrong}, "
            f"got {int(heads['transaction_id'][wrong])}"
        )
    checksums = fixed_width_values(pc.binary_slice(records, -CHECKSUM_BYTES), _CHECKSUM_DTYPE, count)
    # Each record's data then its checksum, back to back: one CRC pass checks every checksum.
    tails = pc.binary_slice(records, WIRE_HEAD_BYTES, int(offsets[-1]))  # to each record's end
    tail_offsets = np.frombuffer(tails.buffers()[1], dtype=np.int64, count=count + 1)
    tail_bytes = tails.buffers()[2]
    tail_view = memoryview(tail_bytes) if tail_bytes is not None else memoryview(b"")
    if not chunk_crcs_match(tail_view, tail_offsets, checksums):
        raise BadRecordsError(
            f"partition {partition_id}: a data checksum mismatch in transactions {first}..{first + count - 1}"
        )
    data = pc.binary_slice(records, WIRE_HEAD_BYTES, -CHECKSUM_BYTES).cast(pa.binary())
    return record_batch(partition_id, txids, heads, data, checksums), count


def _check_txids(txids: np.ndarray, first: int, partition_id: int) -> np.ndarray:
    expected = np.arange(first, first + len(txids), dtype=np.int64)
    if not np.array_equal(txids, expected):
        wrong = int(np.flatnonzero(txids != expected)[0])
        raise BadRecordsError(
            f"partition {partition_id}: expected transaction {first + wrong}, got {int(txids[wrong])}"
        )
    return expected


def _pooled(rows: int, columns: int) -> np.ndarray:
    """A writable uint8 matrix from Arrow's memory pool, which reuses its memory: numpy's own
    megabytes come from fresh pages each time (page faults cost more than the copy)."""
    return np.frombuffer(pa.allocate_buffer(rows * columns), dtype=np.uint8).reshape(rows, columns)


def _decode_matrix(
    body: memoryview, first: int, partition_id: int, count: int, stride: int
) -> pa.RecordBatch:
    """:func:`decode_batch` of ``count`` records of ``stride`` bytes each: strided views of the
    fields, one copy of the data (the column) and one of the data and checksums (the check)."""
    matrix = np.frombuffer(body, dtype=np.uint8, count=count * stride).reshape(count, stride)
    heads = np.ndarray((count,), dtype=_WIRE_HEAD_DTYPE, buffer=body, strides=(stride,))
    txids = _check_txids(heads["transaction_id"], first, partition_id)
    data_end = stride - CHECKSUM_BYTES
    checksums = np.ndarray((count,), dtype=_CHECKSUM_DTYPE, buffer=body, offset=data_end, strides=(stride,))
    # Each record's data then its checksum, back to back (one row each): one CRC pass.
    tails = _pooled(count, stride - WIRE_HEAD_BYTES)
    tails[:] = matrix[:, WIRE_HEAD_BYTES:]
    if not zeroed_crcs_ok(tails, checksums):
        raise BadRecordsError(
            f"partition {partition_id}: a data checksum mismatch in transactions {first}..{first + count - 1}"
        )
    length = data_end - WIRE_HEAD_BYTES
    values = pa.allocate_buffer(count * length)
    if length:
        np.frombuffer(values, dtype=np.uint8).reshape(count, length)[:] = tails[:, :length]
    value_offsets = pa.py_buffer(np.arange(count + 1, dtype=np.int32) * np.int32(length))
    data = pa.Array.from_buffers(pa.binary(), count, [None, value_offsets, values])
    return record_batch(partition_id, txids, heads, data, checksums)


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def records_batch(partition_id: int, records: Sequence[Record]) -> pa.RecordBatch:
    txids, req_ids, headers, data, checksums = zip(*records, strict=True)
    client_ids, generations, _, seq_nums = zip(*req_ids, strict=True)
    types = [f.type for f in ARROW_SCHEMA]
    columns = [
        pa.repeat(pa.scalar(partition_id, types[0]), len(records)),
        pa.array(txids, types[1]),
        pa.array(client_ids, types[2]),
        pa.array(generations, types[3]),
        pa.array(seq_nums, types[4]),
        pa.array(headers, types[5]),
        pa.array(data, types[6]),
        pa.array(checksums, types[7]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _read_network(part: NetworkSlice) -> Iterator[pa.RecordBatch]:
    return read_slice_runs(part, decode_batch)


def read_part(
    part: SegmentSlice | NetworkSlice | TierSlice, on_corrupt: str, counts: SourceCounts | None = None
) -> Iterator[pa.RecordBatch]:
    """The records of a slice, in txid order: local segment files, the storage nodes or their
    tier (``counts`` counts the rows the tier gave). ``on_corrupt`` is for local files: a
    damaged record elsewhere is read from another copy."""
    if isinstance(part, NetworkSlice):
        yield from _read_network(part)
    elif isinstance(part, TierSlice):
        yield from read_tier_slice(part, _read_network, counts)
    else:
        yield from read_slice(part, on_corrupt)
