"""A run of records as a record list carries them, written to a segment without a ``Record`` each.

The storage node's append path: an APPEND_REQUEST's record list (reference §1.2) is cut once,
in the data port's decoder, into where each record starts and its txid (one ``unpack_from`` a
record), and kept as the request's bytes. The segment's bytes are made from those bytes
(:meth:`WireRecordRun.encode`): the wire layout ``txid, reqId, header, dataLength, data,
dataChecksum`` becomes the disk layout ``txid, reqId, header, dataLength, dataChecksum, data,
CRC`` (reference §1.4): the 32 leading bytes are the same, the data checksum moves in front of
the data and the record's CRC32 is computed over the disk layout's header and data, as
:func:`~waltz_engine.disk.record_format.encode_records` computes it for a ``Record``. The
reverse of :func:`waltz_engine.disk.record_columns.disk_to_wire`, the reads' fast path.

Decoding each record into a ``Record`` (a ``ReqId``, a copy of its data) and encoding it again
was a tenth of a storage node's CPU for a lone append; the bytes on disk are the same either
way (``tests/storage/test_storage_record_run.py`` checks them against ``encode_records`` and
the original's vectors).

:class:`RecordList` gives a sequence of ``Record`` objects (tools, backups, tests) the same
interface, so a segment appends either the same way (:class:`AppendRun`).
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zlib
from collections.abc import Sequence
from typing import Protocol

from waltz_engine.common.record import Record
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES, encode_records
from waltz_engine.wire.errors import InvalidValueError, TruncatedMessageError
from waltz_engine.wire.primitives import (
    I32,
    INT32_SIZE_BYTES,
    RECORD_MIN_SIZE_BYTES,
    Buffer,
    read_count,
    read_records,
)

# A wire record: txid, reqId (four int32s), header, dataLength (32 bytes, the same on disk),
# then the data and the data checksum.
WIRE_PREFIX_BYTES = 32
# The txid and the data length of a wire record, in one unpack.
_TXID_AND_LENGTH = struct.Struct(">q20xi")
assert _TXID_AND_LENGTH.size == WIRE_PREFIX_BYTES
# A record is one CRC longer on disk than on the wire.
DISK_EXTRA_BYTES = 4
_CRC = struct.Struct(">I")


class AppendRun(Protocol):
    """Records with consecutive txids to append, as a segment writes them."""

    def __len__(self) -> int: ...

    def transaction_id(self, index: int) -> int:
        """The txid of record ``index``."""
        ...

    def consecutive_from(self, transaction_id: int) -> bool:
        """Whether the records' txids are ``transaction_id``, ``transaction_id + 1``, ..."""
        ...

    def end_within(self, start: int, room_bytes: int) -> int:
        """Where a segment with ``room_bytes`` left before its threshold stops taking records
        from ``start``: after the first one that passes it (a segment ends past its threshold,
        as the original's), else after the last."""
        ...

    def encode(self, start: int, end: int, start_offset: int) -> tuple[bytes, bytes]:
        """Records ``start .. end - 1`` as a segment's bytes and their index entries (offsets
        from ``start_offset``)."""
        ...


class WireRecordRun:
    """A record list's records in the bytes they came in (no count): ``starts[i]`` is where
    record ``i`` begins in ``buf``, ``starts[-1]`` where the last ends; ``txids`` theirs."""

    __slots__ = ("buf", "starts", "txids", "_consecutive")

    def __init__(self, buf: Buffer, starts: list[int], txids: list[int], consecutive: bool) -> None:
        assert len(starts) == len(txids) + 1
        self.buf = buf
        self.starts = starts
        self.txids = txids
        # Whether each txid is the one before plus one (found as the decoder cut them).
        self._consecutive = consecutive

    def __len__(self) -> int:
        return len(self.txids)

    def __repr__(self) -> str:
        first = self.txids[0] if self.txids else None
        return f"WireRecordRun({len(self.txids)} records from txid {first})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireRecordRun):
            return NotImplemented
        return self.wire_bytes() == other.wire_bytes()

    def __hash__(self) -> int:
        return hash(self.wire_bytes())

    def transaction_id(self, index: int) -> int:
        return self.txids[index]

    def consecutive_from(self, transaction_id: int) -> bool:
        txids = self.txids
        return not txids or (txids[0] == transaction_id and self._consecutive)

    def disk_bytes_from(self, start: int) -> int:
        """What records ``start ..`` take in a segment."""
        count = len(self.txids)
        return self.starts[count] - self.starts[start] + DISK_EXTRA_BYTES * (count - start)

    def end_within(self, start: int, room_bytes: int) -> int:
        count = len(self.txids)
        if self.disk_bytes_from(start) <= room_bytes:
            return count  # (the usual case: no record by record)
        starts = self.starts
        base = starts[start]
        end = start
        while end < count:
            end += 1
            if starts[end] - base + DISK_EXTRA_BYTES * (end - start) > room_bytes:
                break
        return end

    def wire_bytes(self) -> bytes:
        """The records as they came (the record list without its count)."""
        return bytes(self.buf[self.starts[0] : self.starts[-1]])

    def records(self) -> tuple[Record, ...]:
        """The records as objects: for the rare paths that compare or refill them."""
        # The count is right before the records (the decoder read it there).
        records, _ = read_records(self.buf, self.starts[0] - INT32_SIZE_BYTES)
        assert len(records) == len(self.txids)
        return records

    def encode(self, start: int, end: int, start_offset: int) -> tuple[bytes, bytes]:
        """The disk layout of records ``start .. end - 1``: per record the shared 32 bytes, the
        data checksum, the data, then the CRC32 of those (three C calls of ``zlib.crc32``
        chained over the pieces, no copy of the record before the join)."""
        view = memoryview(self.buf)
        starts = self.starts
        crc32 = zlib.crc32
        pack_crc = _CRC.pack
        parts: list[Buffer] = []
        offsets: list[int] = []
        offset = start_offset
        for i in range(start, end):
            begin, stop = starts[i], starts[i + 1]
            prefix = view[begin : begin + WIRE_PREFIX_BYTES]
            checksum = view[stop - INT32_SIZE_BYTES : stop]
            data = view[begin + WIRE_PREFIX_BYTES : stop - INT32_SIZE_BYTES]
            offsets.append(offset)
            parts += (prefix, checksum, data, pack_crc(crc32(data, crc32(checksum, crc32(prefix)))))
            offset += stop - begin + DISK_EXTRA_BYTES
        return b"".join(parts), struct.pack(f">{len(offsets)}q", *offsets)

    def disk_record(self) -> bytes:
        """:meth:`encode`'s data for a run of one record (the lone appender's): the same bytes,
        without a run's loop and lists."""
        begin, stop = self.starts  # (one record: two starts)
        return disk_record(self.buf, begin, stop)


def disk_record(buf: Buffer, begin: int, stop: int) -> bytes:
    """The disk bytes of the one wire record at ``buf[begin:stop]`` (:meth:`WireRecordRun.encode`'s
    for a run of one record): the storage node's lone append, from the request's bytes."""
    view = memoryview(buf)
    prefix = view[begin : begin + WIRE_PREFIX_BYTES]
    checksum = view[stop - INT32_SIZE_BYTES : stop]
    data = view[begin + WIRE_PREFIX_BYTES : stop - INT32_SIZE_BYTES]
    crc32 = zlib.crc32
    return b"".join((prefix, checksum, data, _CRC.pack(crc32(data, crc32(checksum, crc32(prefix))))))


class JoinedRuns:
    """Several requests' runs appended as one (a group commit), in order."""

    __slots__ = ("runs", "_ends")

    def __init__(self, runs: Sequence[WireRecordRun]) -> None:
        self.runs = runs
        # Where each run ends in the joined numbering.
        self._ends = list(itertools.accumulate(len(run) for run in runs))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> tuple[int, int]:
        """(which run, the index in it) of record ``index``."""
        which = bisect.bisect_right(self._ends, index)
        return which, index - (self._ends[which - 1] if which else 0)

    def transaction_id(self, index: int) -> int:
        which, local = self._locate(index)
        return self.runs[which].transaction_id(local)

    def consecutive_from(self, transaction_id: int) -> bool:
        for run in self.runs:
            if not run.consecutive_from(transaction_id):
                return False
            transaction_id += len(run)
        return True

    def end_within(self, start: int, room_bytes: int) -> int:
        which, local = self._locate(start)
        first = start - local  # the first record of run ``which``, in the joined numbering
        while which < len(self.runs):
            run = self.runs[which]
            if local < len(run.txids):
                used = run.disk_bytes_from(local)
                if used > room_bytes:
                    return first + run.end_within(local, room_bytes)
                room_bytes -= used
            first += len(run.txids)
            which, local = which + 1, 0
        return first

    def encode(self, start: int, end: int, start_offset: int) -> tuple[bytes, bytes]:
        data: list[bytes] = []
        index: list[bytes] = []
        offset = start_offset
        which, local = self._locate(start)
        remaining = end - start
        while remaining > 0:
            run = self.runs[which]
            stop = min(len(run), local + remaining)
            run_data, run_index = run.encode(local, stop, offset)
            data.append(run_data)
            index.append(run_index)
            offset += len(run_data)
            remaining -= stop - local
            which, local = which + 1, 0
        return b"".join(data), b"".join(index)


class RecordList:
    """:class:`AppendRun` of ``Record`` objects (tools, backups, refills, tests)."""

    __slots__ = ("records",)

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def transaction_id(self, index: int) -> int:
        return self.records[index].transaction_id

    def consecutive_from(self, transaction_id: int) -> bool:
        return all(r.transaction_id == transaction_id + i for i, r in enumerate(self.records))

    def end_within(self, start: int, room_bytes: int) -> int:
        records = self.records
        end = start
        used = 0
        while end < len(records):
            used += RECORD_OVERHEAD_BYTES + len(records[end].data)
            end += 1
            if used > room_bytes:
                break
        return end

    def encode(self, start: int, end: int, start_offset: int) -> tuple[bytes, bytes]:
        records = self.records
        return encode_records(records[start:end] if start or end < len(records) else records, start_offset)


def read_wire_record_run(buf: Buffer, pos: int) -> tuple[WireRecordRun, int]:
    """A record list (int32 count, then the records) as a :class:`WireRecordRun`: the codec's
    field reader for APPEND_REQUEST on the storage data port. Refuses what
    :func:`~waltz_engine.wire.primitives.read_records` refuses, with the same errors."""
    count, pos = read_count(buf, pos, RECORD_MIN_SIZE_BYTES, "record list")
    unpack = _TXID_AND_LENGTH.unpack_from
    size = len(buf)
    starts = [pos]
    txids: list[int] = []
    consecutive = True
    for _ in range(count):
        txid, length = unpack(buf, pos)
        if length < 0:
            raise InvalidValueError(f"record {txid} has data length {length}")
        end = pos + WIRE_PREFIX_BYTES + length
        if end + INT32_SIZE_BYTES > size:
            raise TruncatedMessageError(f"record {txid} with {length} data bytes runs past the payload")
        if txids and txid != txids[-1] + 1:
            consecutive = False
        txids.append(txid)
        pos = end + INT32_SIZE_BYTES
        starts.append(pos)
    return WireRecordRun(buf, starts, txids, consecutive), pos


def write_wire_record_run(out: bytearray, run: WireRecordRun) -> None:
    out += I32.pack(len(run))
    out += run.buf[run.starts[0] : run.starts[-1]]
