"""Parse a range of a segment's records into Arrow record batches, fast, verifying every CRC.

The fast path reads the index entries of the range, then the data region a chunk at a time
(one ``pread`` per ~8 MiB), cuts the 36-byte record headers, data fields and CRCs of a whole
chunk out with Arrow kernels, checks the chunk is self-consistent (consecutive txids, each
record ending where the next begins, as the index says) and builds the Arrow columns from
numpy buffers. Every record's CRC32 is checked by one ``zlib.crc32`` over the whole chunk
(:func:`chunk_crcs_match`); only a chunk that fails it is checked record by record, to name
the damaged ones.

A chunk that does not check out (damaged index, torn or overwritten record) is re-read with
the engine's :class:`~waltz_engine.disk.segment_reader.SegmentReader`, which walks the data
file record by record and says precisely what is wrong; ``on_corrupt`` then decides whether
that fails the read or drops the damaged records.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark.schema import ARROW_SCHEMA
from waltz_engine.common.errors import WaltzError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES, SegmentFileHeader
from waltz_engine.disk.record_columns import CRC_DTYPE as _CRC_DTYPE
from waltz_engine.disk.record_columns import CRC_SIZE_BYTES, chunk_crcs_match
from waltz_engine.disk.record_columns import HEADER_DTYPE as _HEADER_DTYPE
from waltz_engine.disk.record_format import (
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
)
from waltz_engine.disk.segment_reader import (
    KIND_BAD_RECORD_HEADER,
    KIND_CHECKSUM,
    KIND_TORN_RECORD,
    KIND_TXID_MISMATCH,
    SegmentReader,
    SegmentRecord,
)

ON_CORRUPT_FAIL = "fail"
ON_CORRUPT_SKIP = "skip"
ON_CORRUPT_CHOICES = (ON_CORRUPT_FAIL, ON_CORRUPT_SKIP)

# Bytes of the data file parsed per Arrow batch: big enough to amortize the numpy calls,
# small enough that a worker's memory stays bounded whatever the segment size (up to 1 GB).
CHUNK_BYTES = 8 << 20
# Index entries read at a time (8 bytes each): a slice's index is not held whole, so a worker's
# memory does not grow with the segment (a 1 GB segment of small records has millions).
INDEX_WINDOW_ENTRIES = 1 << 18
# Where the data length sits in a record header.
_LENGTH_OFFSET: int = _HEADER_DTYPE.fields["length"][1]  # type: ignore[index]  # a structured dtype has fields
# Problems of the walk that mean a committed record cannot be trusted (index disagreements
# alone do not: the record itself is whole and its CRC says so).
_CORRUPTION_KINDS = frozenset({KIND_CHECKSUM, KIND_TORN_RECORD, KIND_BAD_RECORD_HEADER, KIND_TXID_MISMATCH})


class CorruptRecordError(WaltzError):
    """A committed record fails its checksum or cannot be read (``on_corrupt=fail``)."""


@dataclass(frozen=True)
class SegmentSlice:
    """One unit of work (one Spark input partition): txids ``from_txid..to_txid`` of a segment."""

    partition_id: int
    path: str
    first_txid: int
    from_txid: int
    to_txid: int  # inclusive

    @property
    def count(self) -> int:
        return max(0, self.to_txid - self.from_txid + 1)


def read_slice(part: SegmentSlice, on_corrupt: str = ON_CORRUPT_FAIL) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` in txid order, as batches of :data:`ARROW_SCHEMA`."""
    if on_corrupt not in ON_CORRUPT_CHOICES:
        raise ValueError(f"on_corrupt must be one of {ON_CORRUPT_CHOICES}, got {on_corrupt!r}")
    if part.count == 0:
        return
    with open(part.path, "rb") as data_file, open(Path(part.path).with_suffix(".idx"), "rb") as index_file:
        data_fd, index_fd = data_file.fileno(), index_file.fileno()
        header = SegmentFileHeader.from_bytes(os.pread(data_fd, HEADER_SIZE_BYTES, 0))
        if header.partition_id != part.partition_id or header.first_transaction_id != part.first_txid:
            raise CorruptRecordError(
                f"{part.path}: header says partition {header.partition_id} first txid "
                f"{header.first_transaction_id}, expected {part.partition_id} / {part.first_txid}"
            )
        data_size = os.fstat(data_fd).st_size
        for window_from in range(part.from_txid, part.to_txid + 1, INDEX_WINDOW_ENTRIES):
            window_count = min(INDEX_WINDOW_ENTRIES, part.to_txid - window_from + 1)
            offsets = _index_offsets(index_fd, part.first_txid, window_from, window_count)
            # Records the index knows of in the window; the rest (a damaged index) are walked to.
            indexed = min(len(offsets), window_count)
            start = 0
            while start < indexed:
                base = int(offsets[start])
                stop = max(int(np.searchsorted(offsets[:indexed], base + CHUNK_BYTES)), start + 1)
                # A chunk ends where its next record starts; after the index's last entry only
                # the end of the file bounds it (the lengths in the headers then say).
                end = int(offsets[stop]) if stop < len(offsets) else data_size
                buf = os.pread(data_fd, max(0, end - base), base)
                relative = offsets[start:stop] - base
                parsed = _parse_chunk(buf, relative, window_from + start, part.partition_id)
                if parsed is None:
                    yield from _walk(part, window_from + start, on_corrupt)
                    return
                batch = _check_crcs(parsed, buf, part, on_corrupt, base)
                if batch.num_rows:
                    yield batch
                start = stop
            if indexed < window_count:
                yield from _walk(part, window_from + indexed, on_corrupt)
                return


def _index_offsets(index_fd: int, first_txid: int, from_txid: int, count: int) -> np.ndarray:
    """Index entries of txids ``from_txid`` on (``count`` of them) plus the one after (where
    their bytes end), as far as the index has them."""
    raw = os.pread(
        index_fd,
        (count + 1) * INDEX_ENTRY_SIZE_BYTES,
        HEADER_SIZE_BYTES + (from_txid - first_txid) * INDEX_ENTRY_SIZE_BYTES,
    )
    whole = len(raw) - len(raw) % INDEX_ENTRY_SIZE_BYTES
    return np.frombuffer(raw[:whole], dtype=">i8").astype(np.int64)


class _Chunk(NamedTuple):
    batch: pa.RecordBatch
    record_offsets: np.ndarray  # where each record starts in the chunk, and where the last ends
    stored_crcs: np.ndarray  # each record's CRC32 as stored (uint32)


def _parse_chunk(buf: bytes, relative: np.ndarray, first_txid: int, partition_id: int) -> _Chunk | None:
    """The records starting at ``relative`` offsets of ``buf``; None when they do not check out.

    The chunk is wrapped, without a copy, as an Arrow array of whole records (value k = record
    k's bytes); Arrow's ``binary_slice`` kernel then cuts out every header, data field and CRC
    in C++ — per-record work that numpy fancy indexing did several times slower."""
    n = len(relative)
    if n == 0 or relative[0] != 0 or int(relative[-1]) + RECORD_OVERHEAD_BYTES > len(buf):
        return None
    # Only the last record's end is not the next one's start: its header's length says it.
    last = int(relative[-1])
    last_length = int.from_bytes(buf[last + _LENGTH_OFFSET : last + _LENGTH_OFFSET + 4], "big", signed=True)
    record_offsets = np.empty(n + 1, dtype=np.int64)
    record_offsets[:n] = relative
    record_offsets[n] = last + RECORD_OVERHEAD_BYTES + last_length
    record_sizes = np.diff(record_offsets)
    # Every slice below must find a whole header and CRC in each record.
    if last_length < 0 or int(record_offsets[n]) > len(buf) or (record_sizes < RECORD_OVERHEAD_BYTES).any():
        return None
    records = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(record_offsets), pa.py_buffer(buf)]
    )
    heads = fixed_width_values(pc.binary_slice(records, 0, RECORD_HEADER_SIZE_BYTES), _HEADER_DTYPE, n)
    expected_txids = np.arange(first_txid, first_txid + n, dtype=np.int64)
    if not (
        np.array_equal(heads["length"], record_sizes - RECORD_OVERHEAD_BYTES)
        and np.array_equal(heads["transaction_id"], expected_txids)
    ):
        return None
    data = pc.binary_slice(records, RECORD_HEADER_SIZE_BYTES, -CRC_SIZE_BYTES).cast(pa.binary())
    stored_crcs = fixed_width_values(pc.binary_slice(records, -CRC_SIZE_BYTES), _CRC_DTYPE, n)
    batch = record_batch(partition_id, expected_txids, heads, data, heads["checksum"])
    return _Chunk(batch, record_offsets, stored_crcs)


def record_batch(
    partition_id: int, txids: np.ndarray, heads: np.ndarray, data: pa.Array, checksums: np.ndarray
) -> pa.RecordBatch:
    """A batch of :data:`ARROW_SCHEMA` from parsed headers (fields client_id, generation,
    seq_num, header), the data column and the data checksums: the disk's and the wire's."""
    n = len(txids)
    columns = [
        pa.array(np.full(n, partition_id, dtype=np.int32)),
        pa.array(txids),
        pa.array(heads["client_id"].astype(np.int32)),
        pa.array(heads["generation"].astype(np.int32)),
        pa.array(heads["seq_num"].astype(np.int32)),
        pa.array(heads["header"].astype(np.int32)),
        data,
        pa.array(checksums.astype(np.int32)),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def fixed_width_values(sliced: pa.Array, dtype: np.dtype, n: int) -> np.ndarray:
    """The values of a binary array whose ``n`` values all have ``dtype``'s size, as numpy."""
    values = sliced.buffers()[2]
    assert sliced.offset == 0 and values is not None and len(values) >= n * dtype.itemsize
    return np.frombuffer(values, dtype=dtype, count=n)


def _check_crcs(chunk: _Chunk, buf: bytes, part: SegmentSlice, on_corrupt: str, base: int) -> pa.RecordBatch:
    """``batch`` if every record's CRC32 (over its header and data) matches, else per ``on_corrupt``.

    The whole chunk is checked at once; a chunk that fails is checked a record at a time
    (``zlib.crc32`` over memoryview slices, iterated by ``map``) to find the damaged ones."""
    if chunk_crcs_match(buf, chunk.record_offsets, chunk.stored_crcs):
        return chunk.batch
    n = len(chunk.stored_crcs)
    view = memoryview(buf)
    starts = chunk.record_offsets[:-1]
    crc_starts = chunk.record_offsets[1:] - CRC_SIZE_BYTES
    computed = np.fromiter(
        map(zlib.crc32, map(view.__getitem__, map(slice, starts.tolist(), crc_starts.tolist()))),
        dtype=np.uint32,
        count=n,
    )
    bad = np.flatnonzero(computed != chunk.stored_crcs)
    batch = chunk.batch
    assert len(bad) > 0, "the chunk's CRC failed, so some record's must"
    if on_corrupt == ON_CORRUPT_FAIL:
        k = int(bad[0])
        raise CorruptRecordError(
            f"{part.path}: partition {part.partition_id} transaction {batch.column(1)[k].as_py()} at offset "
            f"{base + int(starts[k])}: record checksum mismatch ({len(bad)} bad record(s) in this chunk)"
        )
    keep = np.ones(n, dtype=np.bool_)
    keep[bad] = False
    return batch.filter(pa.array(keep))


def _walk(part: SegmentSlice, from_txid: int, on_corrupt: str) -> Iterator[pa.RecordBatch]:
    """The slow, exact path: the engine's record-by-record reader, for damaged segments."""
    rows: list[list[object]] = [[] for _ in ARROW_SCHEMA]
    expected = from_txid
    with SegmentReader(Path(part.path)) as reader:
        for item in reader.scan(from_txid):
            if isinstance(item, SegmentRecord):
                record = item.record.record
                txid = record.transaction_id
                if txid < from_txid:
                    continue
                if txid > part.to_txid:
                    break
                if not item.record.record_checksum_ok:
                    continue  # reported by the KIND_CHECKSUM problem that precedes it
                values = (
                    part.partition_id,
                    txid,
                    record.req_id.client_id,
                    record.req_id.generation,
                    record.req_id.seq_num,
                    record.header,
                    record.data,
                    record.checksum,
                )
                for column, value in zip(rows, values, strict=True):
                    column.append(value)
                expected = txid + 1
            elif item.kind in _CORRUPTION_KINDS:
                txid = item.transaction_id if item.transaction_id is not None else expected
                if txid > part.to_txid:
                    break
                if on_corrupt == ON_CORRUPT_FAIL:
                    raise CorruptRecordError(f"{part.path}: partition {part.partition_id}: {item.message}")
    if expected <= part.to_txid and on_corrupt == ON_CORRUPT_FAIL:
        raise CorruptRecordError(
            f"{part.path}: partition {part.partition_id}: transactions {expected}..{part.to_txid} "
            "are not in the segment"
        )
    if rows[0]:
        yield pa.RecordBatch.from_arrays(
            [pa.array(column, type=field.type) for column, field in zip(rows, ARROW_SCHEMA, strict=True)],
            schema=ARROW_SCHEMA,
        )
