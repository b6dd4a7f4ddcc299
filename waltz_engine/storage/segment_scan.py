"""Read-only checks of a segment's files when it is opened (reference §1.6; issue 13, item 2).

They look at the same bounded window as the original's start-up recovery (from the last
checkpoint or the local low-water mark to the end) and decide, without writing anything:

* a **sealed** segment (not the last one) is never written: a record in the window that is
  not whole where its index entry says is reported as damaged, and that is all. Its span is
  known from the next segment's name, so the partition stays contiguous whatever its bytes;
* the **last** segment may lose its *tail*, and only that: a bad record with no whole record
  anywhere after it is what a crash in the middle of an append leaves, and it is cut as the
  original does. A bad record followed by whole ones is damage in the middle: it is kept,
  reported and walked past. A record at or below the durable point (the local low-water mark,
  or the last checkpoint, both synced before they were recorded) is never cut.

:func:`plan_recovery` returns what ``Segment`` then writes (the window's index entries, rebuilt
from the data, and the cut) and the damage it found.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.fileio import pread_upto
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import (
    CHECKPOINT_INTERVAL,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_CRC,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
)
from waltz_engine.storage.damage import Damage, transaction_ranges

# The data after a bad record is searched in chunks this large for the next record's txid.
SEARCH_CHUNK_BYTES = 1 << 20
_TXID = struct.Struct(">q")


def _java_div(dividend: int, divisor: int) -> int:
    """Integer division truncating toward zero, as Java's ``/`` on longs."""
    quotient = abs(dividend) // divisor
    return -quotient if dividend < 0 else quotient


def check_record(seg_fd: int, offset: int, transaction_id: int) -> int:
    """The size of the whole record ``transaction_id`` at ``offset`` (its CRC verifies), or -1."""
    if offset < HEADER_SIZE_BYTES:
        return -1
    head = pread_upto(seg_fd, RECORD_HEADER_SIZE_BYTES, offset)
    if len(head) < RECORD_HEADER_SIZE_BYTES:
        return -1
    stored_txid, _, _, _, data_length, _ = RECORD_HEADER.unpack(head)
    if stored_txid != transaction_id or data_length < 0:
        return -1
    rest = pread_upto(seg_fd, data_length + RECORD_CRC.size, offset + RECORD_HEADER_SIZE_BYTES)
    if len(rest) < data_length + RECORD_CRC.size:
        return -1
    crc = zlib.crc32(memoryview(rest)[:data_length], zlib.crc32(head))
    (stored_crc,) = RECORD_CRC.unpack_from(rest, data_length)
    return RECORD_OVERHEAD_BYTES + data_length if to_signed32(crc) == stored_crc else -1


def index_entry_count(idx_fd: int) -> tuple[int, int]:
    """(whole entries, bytes of a partial last entry) of an index file."""
    body = max(0, os.fstat(idx_fd).st_size - HEADER_SIZE_BYTES)
    return body // INDEX_ENTRY_SIZE_BYTES, body % INDEX_ENTRY_SIZE_BYTES


def read_index(idx_fd: int, first_transaction_id: int, from_transaction_id: int, count: int) -> list[int]:
    """Up to ``count`` index entries from ``from_transaction_id`` (fewer at the index's end)."""
    if count <= 0:
        return []
    position = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (from_transaction_id - first_transaction_id)
    raw = pread_upto(idx_fd, INDEX_ENTRY_SIZE_BYTES * count, position)
    whole = len(raw) // INDEX_ENTRY_SIZE_BYTES
    return [entry for (entry,) in INDEX_ENTRY.iter_unpack(raw[: whole * INDEX_ENTRY_SIZE_BYTES])]


def recovery_window(index_max_transaction_id: int, local_low_water_mark: int) -> tuple[int, int]:
    """(where the original's recovery scan starts, the last txid known durable).

    The scan starts at the last checkpoint (index and data synced when the next txid was a
    multiple of ``CHECKPOINT_INTERVAL``) or at the local low-water mark (synced before it was
    recorded), whichever is later. Everything before the checkpoint, and up to the low-water
    mark, was synced: never a torn write.
    """
    if index_max_transaction_id <= local_low_water_mark:
        return index_max_transaction_id, index_max_transaction_id
    checkpoint = _java_div(index_max_transaction_id - 1, CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
    return max(checkpoint, local_low_water_mark), max(checkpoint - 1, local_low_water_mark)


def _bad_record_reason(seg_fd: int, offset: int, transaction_id: int, data_end: int) -> str:
    """Why there is no whole record ``transaction_id`` at ``offset`` (for the report)."""
    if not HEADER_SIZE_BYTES <= offset < data_end:
        return "its index entry points outside the data file"
    head = pread_upto(seg_fd, RECORD_HEADER_SIZE_BYTES, offset)
    if len(head) < RECORD_HEADER_SIZE_BYTES:
        return "the data file ends inside it"
    stored_txid, _, _, _, data_length, _ = RECORD_HEADER.unpack(head)
    if stored_txid != transaction_id:
        return f"the bytes at offset {offset} say transaction {stored_txid}"
    if data_length < 0 or offset + RECORD_OVERHEAD_BYTES + data_length > data_end:
        return f"its data length {data_length} runs past the data file"
    return "record checksum mismatch"


def check_sealed(
    seg_fd: int, idx_fd: int, first_transaction_id: int, end_transaction_id: int, local_low_water_mark: int
) -> list[Damage]:
    """What is wrong with a sealed segment holding ``first`` .. ``end - 1``; reads only.

    Each record of the recovery window is checked where its index entry says, exactly as a
    read would find it, so the report names the records reads will refuse.
    """
    assert end_transaction_id > first_transaction_id, "a sealed segment holds a record"
    damages: list[Damage] = []
    entries, partial = index_entry_count(idx_fd)
    expected = end_transaction_id - first_transaction_id
    if entries != expected or partial:
        extra = f" and {partial} bytes of a partial entry" if partial else ""
        damages.append(Damage(f"the index lists {entries} transactions{extra}; the segment holds {expected}"))
    listed = min(entries, expected)
    if listed < expected:
        damages.append(Damage("not in the index", first_transaction_id + listed, end_transaction_id - 1))
    if listed == 0:
        return damages
    data_end = os.fstat(seg_fd).st_size
    start, _ = recovery_window(first_transaction_id + listed - 1, local_low_water_mark)
    start = max(start, first_transaction_id)
    offsets = read_index(idx_fd, first_transaction_id, start, first_transaction_id + listed - start)
    bad: dict[int, str] = {}
    end = None
    for i, offset in enumerate(offsets):
        txid = start + i
        size = check_record(seg_fd, offset, txid) if offset < data_end else -1
        if size < 0:
            bad[txid] = _bad_record_reason(seg_fd, offset, txid, data_end)
            end = None
        else:
            end = offset + size
    for first, last in transaction_ranges(bad):
        damages.append(Damage(bad[first], first, last))
    if end is not None and listed == expected and end < data_end:
        damages.append(Damage(f"{data_end - end} stray bytes after the last record"))
    return damages


@dataclass
class RecoveryPlan:
    """What recovery of the last segment writes, and what it found."""

    next_transaction_id: int
    next_offset: int
    rewrite_from: int  # the first txid whose index entry ``index`` rewrites
    index: bytes
    cut: bool  # the data from ``next_offset`` on is a torn tail, to be cut
    damages: list[Damage] = field(default_factory=list)


class _LastSegment:
    """The walk over the last segment's window (read only)."""

    def __init__(self, seg_fd: int, idx_fd: int, first_transaction_id: int) -> None:
        self.seg_fd = seg_fd
        self.idx_fd = idx_fd
        self.first = first_transaction_id
        self.index_max = first_transaction_id + index_entry_count(idx_fd)[0] - 1
        self.data_end = os.fstat(seg_fd).st_size

    def start_of_walk(self, start: int) -> tuple[int, int]:
        """The record to walk from: ``start`` where its index entry says, else the closest earlier
        one whole where its entry says, else the segment's first record."""
        if start <= self.first:
            return self.first, HEADER_SIZE_BYTES
        offsets = read_index(self.idx_fd, self.first, self.first, start - self.first + 1)
        for txid in range(self.first + len(offsets) - 1, self.first - 1, -1):
            if check_record(self.seg_fd, offsets[txid - self.first], txid) >= 0:
                return txid, offsets[txid - self.first]
        return self.first, HEADER_SIZE_BYTES

    def successor(self, transaction_id: int, offset: int) -> tuple[int, int] | None:
        """The first whole record after the bad one ``transaction_id`` at ``offset``: through the
        index entries of the later txids, else by searching the data for the next txid."""
        later = read_index(self.idx_fd, self.first, transaction_id + 1, self.index_max - transaction_id)
        for i, candidate in enumerate(later):
            txid = transaction_id + 1 + i
            if offset < candidate < self.data_end and check_record(self.seg_fd, candidate, txid) >= 0:
                return txid, candidate
        return self._search(transaction_id + 1, offset + 1)

    def _search(self, transaction_id: int, offset: int) -> tuple[int, int] | None:
        """The whole record ``transaction_id`` at or after ``offset``, found by its txid bytes."""
        pattern = _TXID.pack(transaction_id)
        position = offset
        while position < self.data_end:
            chunk = pread_upto(self.seg_fd, min(SEARCH_CHUNK_BYTES, self.data_end - position), position)
            found = chunk.find(pattern)
            while found >= 0:
                if check_record(self.seg_fd, position + found, transaction_id) >= 0:
                    return transaction_id, position + found
                found = chunk.find(pattern, found + 1)
            # Overlap the chunks so a txid split between two is still found.
            position += max(1, len(chunk) - (_TXID.size - 1))
            if len(chunk) < SEARCH_CHUNK_BYTES:
                break
        return None


def plan_recovery(
    seg_fd: int, idx_fd: int, first_transaction_id: int, local_low_water_mark: int
) -> RecoveryPlan:
    """Walk the last segment's recovery window; decide what is kept, cut and reported."""
    files = _LastSegment(seg_fd, idx_fd, first_transaction_id)
    start, durable = recovery_window(files.index_max, local_low_water_mark)
    txid, offset = files.start_of_walk(start)
    rewrite_from = txid
    index = bytearray()
    bad: dict[int, str] = {}
    cut = False
    while True:
        size = check_record(seg_fd, offset, txid)
        if size >= 0:
            index += INDEX_ENTRY.pack(offset)
            offset += size
            txid += 1
            continue
        if offset >= files.data_end:
            break  # the data ends after a whole record
        reason = _bad_record_reason(seg_fd, offset, txid, files.data_end)
        found = files.successor(txid, offset)
        if found is None and txid > durable:
            cut = True  # nothing whole after it: the tail of an interrupted append
            break
        if found is None:
            # A synced record we cannot see past: keep every byte, refuse what cannot be found.
            bad.update((t, reason if t == txid else "cannot be located") for t in range(txid, durable + 1))
            plan = RecoveryPlan(durable + 1, files.data_end, rewrite_from, bytes(index), False)
            return _with_damages(plan, bad)
        successor_txid, successor_offset = found
        bad.update((t, reason if t == txid else "cannot be located") for t in range(txid, successor_txid))
        # Their entries point at the damaged bytes: reads there are refused, never misread.
        index += INDEX_ENTRY.pack(offset) * (successor_txid - txid)
        txid, offset = successor_txid, successor_offset
    return _with_damages(RecoveryPlan(txid, offset, rewrite_from, bytes(index), cut), bad)


def _with_damages(plan: RecoveryPlan, bad: dict[int, str]) -> RecoveryPlan:
    plan.damages = [Damage(bad[first], first, last) for first, last in transaction_ranges(bad)]
    return plan
