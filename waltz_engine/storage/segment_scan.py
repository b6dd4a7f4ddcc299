"""Read-only checks of a segment's files when it is opened (reference §1.6; issue 13, item 2).

They look at the same bounded window as the original's start-up recovery (from the last
checkpoint or the local low-water mark to the end) and decide, without writing anything:

* a **sealed** segment (not the last one) is never written: a record in the window that is
  not whole where its index entry says is reported as damaged, and that is all. Its span is
  known from the next segment's name, so the partition stays contiguous whatever its bytes;
* the **last** segment follows the original's rule above the *durable point*: the walk stops
  at the first record that is not whole and everything from there on is cut (a crash in the
  middle of an append looks exactly like that). At or below the durable point (the local
  low-water mark, or the last checkpoint, both synced before they were recorded) a record is
  never cut: a bad one is kept, reported and stepped over, but only to where its own length
  field or a later index entry locates a whole record (never a search of the data, whose
  payloads are the clients' bytes).

The durable point is only as good as what proves it: a checkpoint is trusted when its index
entry points at a whole record (an index grown by a crash, or with garbage, proves nothing);
otherwise the walk starts at the closest earlier record that is whole where its entry says.

:func:`plan_recovery` returns what ``Segment`` then writes (the index entries of the whole
records it walked, rebuilt from the data, and the cut) and the damage it found.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.fileio import DiskFile, pread_upto
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
from waltz_engine.storage.damage import Damage

# Index entries read at once when a walk looks past damage (8 bytes each: 32 KiB).
INDEX_CHUNK_ENTRIES = 4096
# The most of one record held in memory at once while its checksums are computed.
CHECK_CHUNK_BYTES = 1 << 20

NOT_LOCATED = "cannot be located"


def _java_div(dividend: int, divisor: int) -> int:
    """Integer division truncating toward zero, as Java's ``/`` on longs."""
    quotient = abs(dividend) // divisor
    return -quotient if dividend < 0 else quotient


def check_record(seg_file: DiskFile, offset: int, transaction_id: int, data_end: int | None = None) -> int:
    """The size of the whole record ``transaction_id`` at ``offset``, or -1.

    Whole means what a read means: the txid, the CRC over header and data, and the data
    checksum all check out. ``data_end`` is the data file's size (looked up when not given):
    a length running past it is refused before anything is read, and a record is read in
    chunks of at most ``CHECK_CHUNK_BYTES``.
    """
    if data_end is None:
        data_end = seg_file.size_bytes()
    if offset < HEADER_SIZE_BYTES or offset + RECORD_OVERHEAD_BYTES > data_end:
        return -1
    head = pread_upto(seg_file, RECORD_HEADER_SIZE_BYTES, offset)
    if len(head) < RECORD_HEADER_SIZE_BYTES:
        return -1
    stored_txid, _, _, _, data_length, checksum = RECORD_HEADER.unpack(head)
    if stored_txid != transaction_id or data_length < 0:
        return -1
    size = RECORD_OVERHEAD_BYTES + data_length
    if offset + size > data_end:
        return -1
    crc = zlib.crc32(head)
    data_crc = 0
    position = offset + RECORD_HEADER_SIZE_BYTES
    if data_length + RECORD_CRC.size <= CHECK_CHUNK_BYTES:  # the usual case: one read
        rest = pread_upto(seg_file, data_length + RECORD_CRC.size, position)
        if len(rest) < data_length + RECORD_CRC.size:
            return -1
        data = memoryview(rest)[:data_length]
        crc, data_crc = zlib.crc32(data, crc), zlib.crc32(data)
        tail = rest[data_length:]
    else:
        remaining = data_length
        while remaining > 0:
            chunk = pread_upto(seg_file, min(CHECK_CHUNK_BYTES, remaining), position)
            if not chunk:
                return -1
            crc, data_crc = zlib.crc32(chunk, crc), zlib.crc32(chunk, data_crc)
            position += len(chunk)
            remaining -= len(chunk)
        tail = pread_upto(seg_file, RECORD_CRC.size, position)
        if len(tail) < RECORD_CRC.size:
            return -1
    (stored_crc,) = RECORD_CRC.unpack(tail)
    return size if to_signed32(crc) == stored_crc and to_signed32(data_crc) == checksum else -1


def index_entry_count(idx_file: DiskFile) -> tuple[int, int]:
    """(whole entries, bytes of a partial last entry) of an index file."""
    body = max(0, idx_file.size_bytes() - HEADER_SIZE_BYTES)
    return body // INDEX_ENTRY_SIZE_BYTES, body % INDEX_ENTRY_SIZE_BYTES


def read_index(
    idx_file: DiskFile, first_transaction_id: int, from_transaction_id: int, count: int
) -> list[int]:
    """Up to ``count`` index entries from ``from_transaction_id`` (fewer at the index's end)."""
    if count <= 0:
        return []
    position = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (from_transaction_id - first_transaction_id)
    raw = pread_upto(idx_file, INDEX_ENTRY_SIZE_BYTES * count, position)
    whole = len(raw) // INDEX_ENTRY_SIZE_BYTES
    return [entry for (entry,) in INDEX_ENTRY.iter_unpack(raw[: whole * INDEX_ENTRY_SIZE_BYTES])]


def recovery_window(index_max_transaction_id: int, local_low_water_mark: int) -> tuple[int, int]:
    """(where the original's recovery scan starts, the last txid known durable if the index is right).

    The scan starts at the last checkpoint (index and data synced when the next txid was a
    multiple of ``CHECKPOINT_INTERVAL``) or at the local low-water mark (synced before it was
    recorded), whichever is later. Everything before the checkpoint, and up to the low-water
    mark, was synced: never a torn write. The checkpoint comes from the index's size, so it is
    proven only by a whole record where the index says (see ``plan_recovery``).
    """
    if index_max_transaction_id <= local_low_water_mark:
        return index_max_transaction_id, index_max_transaction_id
    checkpoint = _java_div(index_max_transaction_id - 1, CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
    return max(checkpoint, local_low_water_mark), max(checkpoint - 1, local_low_water_mark)


def _bad_record_reason(seg_file: DiskFile, offset: int, transaction_id: int, data_end: int) -> str:
    """Why there is no whole record ``transaction_id`` at ``offset`` (for the report)."""
    if not HEADER_SIZE_BYTES <= offset < data_end:
        return "its index entry points outside the data file"
    head = pread_upto(seg_file, RECORD_HEADER_SIZE_BYTES, offset)
    if len(head) < RECORD_HEADER_SIZE_BYTES:
        return "the data file ends inside it"
    stored_txid, _, _, _, data_length, _ = RECORD_HEADER.unpack(head)
    if stored_txid != transaction_id:
        return f"the bytes at offset {offset} say transaction {stored_txid}"
    if data_length < 0 or offset + RECORD_OVERHEAD_BYTES + data_length > data_end:
        return f"its data length {data_length} runs past the data file"
    return "record or data checksum mismatch"


class _Damages:
    """Damage found record by record, kept as ranges (a run of one reason is one ``Damage``)."""

    def __init__(self) -> None:
        self.found: list[Damage] = []

    def add(self, what: str, first: int, last: int) -> None:
        if last < first:
            return
        previous = self.found[-1] if self.found else None
        if previous is not None and previous.what == what and previous.last_transaction_id == first - 1:
            self.found[-1] = previous._replace(last_transaction_id=last)
        else:
            self.found.append(Damage(what, first, last))


def check_sealed(
    seg_file: DiskFile,
    idx_file: DiskFile,
    first_transaction_id: int,
    end_transaction_id: int,
    local_low_water_mark: int,
) -> list[Damage]:
    """What is wrong with a sealed segment holding ``first`` .. ``end - 1``; reads only.

    Each record of the recovery window (at most ``CHECKPOINT_INTERVAL`` records) is checked
    where its index entry says, exactly as a read would find it, so the report names the
    records reads will refuse.
    """
    assert end_transaction_id > first_transaction_id, "a sealed segment holds a record"
    damages: list[Damage] = []
    entries, partial = index_entry_count(idx_file)
    expected = end_transaction_id - first_transaction_id
    if entries != expected or partial:
        extra = f" and {partial} bytes of a partial entry" if partial else ""
        damages.append(Damage(f"the index lists {entries} transactions{extra}; the segment holds {expected}"))
    listed = min(entries, expected)
    if listed < expected:
        damages.append(Damage("not in the index", first_transaction_id + listed, end_transaction_id - 1))
    if listed == 0:
        return damages
    data_end = seg_file.size_bytes()
    start, _ = recovery_window(first_transaction_id + listed - 1, local_low_water_mark)
    start = max(start, first_transaction_id)
    offsets = read_index(idx_file, first_transaction_id, start, first_transaction_id + listed - start)
    bad = _Damages()
    end = None
    for i, offset in enumerate(offsets):
        txid = start + i
        size = check_record(seg_file, offset, txid, data_end)
        if size < 0:
            bad.add(_bad_record_reason(seg_file, offset, txid, data_end), txid, txid)
            end = None
        else:
            end = offset + size
    damages += bad.found
    if end is not None and listed == expected and end < data_end:
        damages.append(Damage(f"{data_end - end} stray bytes after the last record"))
    return damages


@dataclass
class RecoveryPlan:
    """What recovery of the last segment writes, and what it found."""

    next_transaction_id: int
    next_offset: int
    # (first txid, entries): the rebuilt index entries of the whole records walked. A damaged
    # record's entry is not among them: its bytes are left as they are.
    index_runs: list[tuple[int, bytes]]
    cut: bool  # the data from ``next_offset`` on is a torn tail, to be cut
    damages: list[Damage] = field(default_factory=list)


class _LastSegment:
    """The walk over the last segment's window (read only)."""

    def __init__(self, seg_file: DiskFile, idx_file: DiskFile, first_transaction_id: int) -> None:
        self.seg_file = seg_file
        self.idx_file = idx_file
        self.first = first_transaction_id
        self.index_max = first_transaction_id + index_entry_count(idx_file)[0] - 1
        self.data_end = seg_file.size_bytes()

    def check(self, offset: int, transaction_id: int) -> int:
        return check_record(self.seg_file, offset, transaction_id, self.data_end)

    def whole_before(self, transaction_id: int) -> tuple[int, int] | None:
        """The closest record before ``transaction_id`` that is whole where its index entry says,
        read back in chunks of ``INDEX_CHUNK_ENTRIES`` entries."""
        # No more records fit in the data than this: entries past them prove nothing.
        most = (self.data_end - HEADER_SIZE_BYTES) // RECORD_OVERHEAD_BYTES
        high = min(transaction_id - 1, self.index_max, self.first + most - 1)
        while high >= self.first:
            low = max(self.first, high - INDEX_CHUNK_ENTRIES + 1)
            offsets = read_index(self.idx_file, self.first, low, high - low + 1)
            for i in range(len(offsets) - 1, -1, -1):
                if self.check(offsets[i], low + i) >= 0:
                    return low + i, offsets[i]
            high = low - 1
        return None

    def start_of_walk(self, start: int, durable: int, local_low_water_mark: int) -> tuple[int, int, int]:
        """(txid, offset) to walk from and the durable point: ``start`` where its index entry says
        when that record is whole; else the closest earlier record whole where its entry says (the
        checkpoint is not proven: only the low-water mark and that record are), else the first."""
        if start <= self.first:
            return self.first, HEADER_SIZE_BYTES, durable
        (offset,) = read_index(self.idx_file, self.first, start, 1) or (-1,)
        if self.check(offset, start) >= 0:
            return start, offset, durable
        found = self.whole_before(start)
        if found is None:
            return self.first, HEADER_SIZE_BYTES, max(local_low_water_mark, min(durable, self.first - 1))
        txid, offset = found
        return txid, offset, max(local_low_water_mark, min(durable, txid))

    def step_over(self, transaction_id: int, offset: int, durable: int) -> tuple[int, int] | None:
        """Where the walk goes on after the bad, durable record ``transaction_id`` at ``offset``:
        the next record whole where the bad one's own length field ends it (or the data's end,
        when it is the durable point itself), else the first later record up to ``durable + 1``
        whole where its index entry says. None when neither locates one."""
        head = pread_upto(self.seg_file, RECORD_HEADER_SIZE_BYTES, offset)
        if len(head) == RECORD_HEADER_SIZE_BYTES:
            stored_txid, _, _, _, data_length, _ = RECORD_HEADER.unpack(head)
            end = offset + RECORD_OVERHEAD_BYTES + data_length
            if stored_txid == transaction_id and data_length >= 0 and end <= self.data_end:
                if self.check(end, transaction_id + 1) >= 0:
                    return transaction_id + 1, end
                if end == self.data_end and transaction_id >= durable:
                    return transaction_id + 1, end
        # Later entries must point past this record's smallest possible extent.
        lowest = offset + RECORD_OVERHEAD_BYTES
        txid = transaction_id + 1
        last = min(durable + 1, self.index_max)
        while txid <= last:
            offsets = read_index(self.idx_file, self.first, txid, min(INDEX_CHUNK_ENTRIES, last - txid + 1))
            if not offsets:
                break
            for i, candidate in enumerate(offsets):
                if candidate >= lowest and self.check(candidate, txid + i) >= 0:
                    return txid + i, candidate
            txid += len(offsets)
        return None


def plan_recovery(
    seg_file: DiskFile, idx_file: DiskFile, first_transaction_id: int, local_low_water_mark: int
) -> RecoveryPlan:
    """Walk the last segment's recovery window; decide what is kept, cut and reported."""
    files = _LastSegment(seg_file, idx_file, first_transaction_id)
    start, durable = recovery_window(files.index_max, local_low_water_mark)
    txid, offset, durable = files.start_of_walk(start, durable, local_low_water_mark)
    runs: list[tuple[int, bytes]] = []
    run_first, run = txid, bytearray()
    bad = _Damages()
    while True:
        size = files.check(offset, txid)
        if size >= 0:
            run += INDEX_ENTRY.pack(offset)
            offset += size
            txid += 1
            continue
        if offset >= files.data_end:
            break  # the data ends after a whole record
        if txid > durable:
            # Not known durable: a torn or dirty tail, or damage the original cuts the same way.
            runs.append((run_first, bytes(run)))
            return RecoveryPlan(txid, offset, runs, True, bad.found)
        # Synced before it was acknowledged: never cut. Keep every byte and step over it.
        reason = _bad_record_reason(seg_file, offset, txid, files.data_end)
        found = files.step_over(txid, offset, durable)
        runs.append((run_first, bytes(run)))
        bad.add(reason, txid, txid)
        if found is None:
            # Nothing whole can be located after it: the records up to the durable point are
            # refused (read from another replica), and the log goes on after them.
            bad.add(NOT_LOCATED, txid + 1, durable)
            return RecoveryPlan(durable + 1, files.data_end, runs, False, bad.found)
        next_txid, offset = found
        bad.add(NOT_LOCATED, txid + 1, next_txid - 1)
        txid = run_first = next_txid
        run = bytearray()
    runs.append((run_first, bytes(run)))
    return RecoveryPlan(txid, offset, runs, False, bad.found)


# The chunk of data the replica checksum reads at once.
CHECKSUM_CHUNK_BYTES = 1 << 20


def file_crc32(file: DiskFile, offset: int, crc: int) -> int:
    """Continue an unsigned running CRC-32 over ``file`` from ``offset`` to its end."""
    while chunk := file.pread(CHECKSUM_CHUNK_BYTES, offset):
        crc = zlib.crc32(chunk, crc)
        offset += len(chunk)
    return crc


def planned_repairs(
    name: str, seg_file: DiskFile, idx_file: DiskFile, first_transaction_id: int, plan: RecoveryPlan
) -> list[str]:
    """What applying ``plan`` to segment ``name``'s files (its records from
    ``first_transaction_id``) would change in them, one line each (nothing: none)."""
    repairs: list[str] = []
    data_end = seg_file.size_bytes()
    if plan.cut and data_end > plan.next_offset:
        repairs.append(
            f"{name}: torn tail: {data_end - plan.next_offset} bytes after transaction "
            f"{plan.next_transaction_id - 1} (offset {plan.next_offset})"
        )
    entries, partial = index_entry_count(idx_file)
    wanted = plan.next_transaction_id - first_transaction_id
    stale = [
        (first, first + len(run) // INDEX_ENTRY_SIZE_BYTES - 1)
        for first, run in plan.index_runs
        if run
        and pread_upto(
            idx_file, len(run), HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (first - first_transaction_id)
        )
        != run
    ]
    if entries < wanted:
        repairs.append(f"{name}: the index lists {entries} of {wanted} transactions")
    elif entries > wanted or partial:
        extra = entries - wanted
        repairs.append(
            f"{name}: the index lists {extra} transactions past the last record"
            + (f" and {partial} bytes of a partial entry" if partial else "")
        )
    elif stale:
        first, last = stale[0]
        repairs.append(f"{name}: index entries of transactions {first}-{last} differ from the records")
    return repairs
