"""RECORD_LIST answers served from a segment's bytes: the fast path of the storage node's reads.

A record list (admin port and data port, reference §1.2, §1.3) was built one ``Record`` per
record and encoded again one at a time; at ~0.2 M records/s that was what limited a network
export. Here the index entries of the range are read at once, the data in chunks of up to
:data:`CHUNK_BYTES` with one ``pread`` each, every record checked by columns (txid, length,
CRC, data checksum) and turned into the wire layout without a Python object per record
(:func:`waltz_engine.disk.record_columns.disk_to_wire`).

The fast path only ever *accepts*: records it cannot prove whole (a damaged index, a torn,
rotten or foreign record, a record larger than a chunk) end it, and the caller reads from
there with the exact reader (``Segment.read_records``), which serves the good records before a
bad one and refuses the bad one with the "corrupt record" error naming it. So the damage rules
of ``segment.py``, ``segment_scan.py`` and ``damage.py`` decide exactly as before.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from waltz_engine.common.fileio import DiskFile, pread_upto
from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_columns import SMALL_RUN_MAX_RECORDS, WIRE_SAVING_BYTES, disk_to_wire
from waltz_engine.disk.record_format import INDEX_ENTRY_SIZE_BYTES, RECORD_OVERHEAD_BYTES
from waltz_engine.wire.frame import MAX_FRAME_SIZE_BYTES
from waltz_engine.wire.primitives import Buffer, write_record

# The most data bytes checked and converted at once: large enough that the per-chunk numpy
# calls cost nothing per record, small enough to bound the node's memory per request.
CHUNK_BYTES = 8 << 20
# The records of one RECORD_LIST answer, in bytes: no chunk is read past this, so an answer
# (this, one more chunk, the frame's head) stays within a frame however many records are asked
# for (2^31 - 1 would otherwise read a whole partition into memory, then fail the frame check).
RECORD_LIST_MAX_BYTES = MAX_FRAME_SIZE_BYTES - 2 * CHUNK_BYTES
# Index entries read at once (8 bytes each).
INDEX_WINDOW_ENTRIES = 1 << 16
_COUNT = struct.Struct(">i")
# What a record takes on the wire besides its data: txid, reqId, header, length, data checksum.
WIRE_RECORD_OVERHEAD_BYTES = RECORD_OVERHEAD_BYTES - WIRE_SAVING_BYTES


class WireRecords(NamedTuple):
    """A record list in the wire layout: ``num_records`` records whose bytes are ``chunks`` in order."""

    num_records: int
    chunks: Sequence[Buffer]

    def record_list(self) -> list[Buffer]:
        """The record list as a message carries it, in pieces to write in order: the int32
        count, then the records."""
        return [_COUNT.pack(self.num_records), *self.chunks]

    def payload(self) -> bytes:
        """:meth:`record_list` in one piece."""
        return b"".join(self.record_list())

    def data_bytes(self) -> int:
        """The records' data bytes, all together."""
        wire_bytes = sum(memoryview(chunk).nbytes for chunk in self.chunks)
        return wire_bytes - self.num_records * WIRE_RECORD_OVERHEAD_BYTES


def encode_wire_records(records: Sequence[Record]) -> bytearray:
    """Records the exact reader returned, in the wire layout (no count)."""
    out = bytearray()
    for record in records:
        write_record(out, record)
    return out


def _index_entries(idx_file: DiskFile, position: int, count: int) -> np.ndarray | list[int]:
    """The entries, as int64s; a few (a short run) as a list (numpy's fixed cost per call is
    far more than a short run's work)."""
    raw = pread_upto(idx_file, count * INDEX_ENTRY_SIZE_BYTES, position)
    entries = len(raw) // INDEX_ENTRY_SIZE_BYTES
    if entries <= SMALL_RUN_MAX_RECORDS + 1:
        return list(struct.unpack_from(f">{entries}q", raw))
    return np.frombuffer(raw, dtype=">i8", count=entries).astype(np.int64)


def read_wire_span(
    seg_file: DiskFile,
    idx_file: DiskFile,
    segment_first_txid: int,
    next_txid: int,
    data_end: int,
    transaction_id: int,
    max_records: int,
    max_bytes: int,
) -> WireRecords:
    """The records ``transaction_id`` .. of one segment (``next_txid`` its next txid, ``data_end``
    where its records end), at most ``max_records``, as far as they check out by columns and no
    chunk is read once ``max_bytes`` of records are; the count says how far that is (0 when the
    first does not)."""
    count = min(max_records, next_txid - transaction_id)
    chunks: list[Buffer] = []
    done = 0
    wire_bytes = 0
    while done < count and wire_bytes < max_bytes:
        first = transaction_id + done
        window = min(INDEX_WINDOW_ENTRIES, count - done)
        # One entry more than the window: where its last record ends (the segment's end after
        # its last record).
        position = HEADER_SIZE_BYTES + (first - segment_first_txid) * INDEX_ENTRY_SIZE_BYTES
        at_end = first + window == next_txid
        offsets = _index_entries(idx_file, position, window + (0 if at_end else 1))
        short = isinstance(offsets, list)
        if at_end and len(offsets) == window:
            offsets = [*offsets, data_end] if short else np.append(offsets, np.int64(data_end))
        if len(offsets) != window + 1:
            break
        if int(offsets[0]) < HEADER_SIZE_BYTES or int(offsets[-1]) > data_end:
            break
        if not _sizes_ok(offsets):
            break
        start = 0
        while start < window:
            if wire_bytes >= max_bytes:
                return WireRecords(done, chunks)  # a short answer: the asker goes on from there
            base = int(offsets[start])
            if isinstance(offsets, list):
                stop = bisect.bisect_right(offsets, base + CHUNK_BYTES) - 1
            else:
                stop = int(np.searchsorted(offsets, base + CHUNK_BYTES, side="right")) - 1
            stop = min(stop, window)
            if stop <= start:
                return WireRecords(done, chunks)  # a record larger than a chunk: the exact reader's
            buf = pread_upto(seg_file, int(offsets[stop]) - base, base)
            if isinstance(offsets, list):
                wire = disk_to_wire(
                    buf, [offset - base for offset in offsets[start : stop + 1]], first + start
                )
            else:
                wire = disk_to_wire(buf, offsets[start : stop + 1] - base, first + start)
            if wire is None:
                return WireRecords(done, chunks)
            chunks.append(wire.data)
            wire_bytes += wire.nbytes
            done += stop - start
            start = stop
    return WireRecords(done, chunks)


def _sizes_ok(offsets: np.ndarray | list[int]) -> bool:
    """Whether every record the offsets bound can hold a record's overhead."""
    if isinstance(offsets, list):
        return all(stop - start >= RECORD_OVERHEAD_BYTES for start, stop in itertools.pairwise(offsets))
    return not bool((np.diff(offsets) < RECORD_OVERHEAD_BYTES).any())
