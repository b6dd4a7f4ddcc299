"""One segment: a ``.seg`` data file and its ``.idx`` index, written as the original does.

Rules (reference §1.5, §1.6):

* Records are appended with consecutive txids. The data file is synced (``fdatasync``) once
  per append call; index entries are written but synced only at a checkpoint, i.e. right
  after the record whose next txid is a multiple of ``CHECKPOINT_INTERVAL`` (then both files
  are ``fsync``ed). An append stops early once the segment is larger than the threshold.
* Within a call, data is written *before* the index entries that point at it. Recovery
  trusts the index entry of the scan start (a checkpoint or the local low-water mark) when
  the index extends past it, so that entry must never point at data that is not there yet.
* On open, the last segment's recovery re-validates records from the last checkpoint (or the
  local low-water mark), rebuilds their index entries and cuts a torn or dirty tail above the
  durable point; a sealed segment is only checked, never written (``segment_scan.py``). Damage
  found either way is kept as it is, refused on reads and listed in ``Segment.damages``.
* A segment whose header names another cluster or partition is never served: the last one is
  refused at open (as the original), a sealed one has every record refused until a refill.
"""

from __future__ import annotations

import bisect
import logging
import uuid
from pathlib import Path

from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.common.fileio import DiskFile, pread_upto, pwrite_all
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.disk.file_header import FORMAT_VERSION, HEADER_SIZE_BYTES, SegmentFileHeader
from waltz_engine.disk.record_format import (
    CHECKPOINT_INTERVAL,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
    DiskRecord,
    read_record,
)
from waltz_engine.disk.record_run import AppendRun
from waltz_engine.storage.damage import Damage
from waltz_engine.storage.file_system import CLOSED_FILE, OS_DISK, Disk
from waltz_engine.storage.segment_files import (
    CORRUPT_RECORD_MESSAGE,
    CorruptRecordError,
    first_transaction_id_of,
)
from waltz_engine.storage.segment_scan import (
    check_record,
    check_sealed,
    file_crc32,
    plan_recovery,
    planned_repairs,
)
from waltz_engine.storage.wire_span import WireRecords, read_wire_span

__all__ = ["CORRUPT_RECORD_MESSAGE", "CorruptRecordError", "Segment"]

log = logging.getLogger(__name__)

# The most bytes one read of a span of records loads; a span is shortened to fit, and a single
# record larger than this is checked in chunks before it is loaded.
MAX_READ_SPAN_BYTES = 8 << 20
# What a sealed segment of another cluster or partition is reported as (none of it is served).
FOREIGN_SEGMENT = "another cluster's or partition's segment, none of its records served"


class Segment:
    """A segment's open files and its write position. Not thread-safe: the partition serializes.

    A sealed (read-only) segment may have its files closed by the partition's LRU cache and
    reopened lazily with ``ensure_open``.
    """

    def __init__(
        self,
        seg_path: Path,
        idx_path: Path,
        header: SegmentFileHeader,
        seg_file: DiskFile,
        idx_file: DiskFile,
        segment_size_threshold_bytes: int,
        disk: Disk = OS_DISK,
    ) -> None:
        self.seg_path = seg_path
        self.idx_path = idx_path
        self.header = header
        self._seg_file = seg_file
        self._idx_file = idx_file
        self._disk = disk
        self._threshold_bytes = segment_size_threshold_bytes
        self._next_transaction_id = header.first_transaction_id
        self._next_offset = HEADER_SIZE_BYTES
        self.writable = False
        self.closed = False
        # What the open found wrong (kept on disk, refused on reads); the header(s) among it.
        self.damages: list[Damage] = []
        self.header_damaged = False
        # Why the segment is another cluster's or partition's (a sealed one: no record served).
        self.foreign: str | None = None
        # What start-up recovery would write, found by a read-only open (which writes nothing).
        self.repairs: list[str] = []
        # Records served from the data past a damaged index entry (each reported once).
        self._located: set[int] = set()

    # --- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        key: uuid.UUID,
        partition_id: int,
        seg_path: Path,
        idx_path: Path,
        local_low_water_mark: int,
        segment_size_threshold_bytes: int,
        *,
        sealed_end: int | None = None,
        disk: Disk = OS_DISK,
        read_only: bool = False,
    ) -> Segment:
        """Open both files and check them; the damage found is in ``segment.damages``.

        ``sealed_end`` is the next segment's first txid when this one is sealed: it is checked
        and never written. Without it this is the last segment, and start-up recovery runs (it
        may cut a torn tail). Damage in the files never stops the open: it is reported, kept
        and refused on reads until a refill replaces the segment. A header naming another
        cluster or partition stops the open of the last segment (its records would be appended
        to and served); a sealed one opens with every record refused.

        ``read_only``: the last segment's recovery is planned, never written; what it would
        write is in ``segment.repairs`` (the read-only open, ``StorageManager.open_read_only``).
        """
        first = first_transaction_id_of(seg_path)
        seg_file = idx_file = CLOSED_FILE
        try:
            seg_file = disk.open(seg_path)
            idx_file = disk.open(idx_path)
            damages: list[Damage] = []
            header, foreign = cls._read_header(seg_file, key, partition_id, first, "data file", damages)
            index_foreign = cls._read_header(idx_file, key, partition_id, first, "index file", damages)[1]
            foreign = foreign or index_foreign
            if foreign is not None and sealed_end is None:
                raise StorageError(
                    f"failed to open segment file {seg_path}: {foreign}: another cluster's or partition's "
                    "segment; move its .seg and .idx away, then recover the partition from a healthy replica"
                )
            segment = cls(seg_path, idx_path, header, seg_file, idx_file, segment_size_threshold_bytes, disk)
            segment.header_damaged = bool(damages)
            if sealed_end is None:
                damages += segment._recover(local_low_water_mark, read_only=read_only)
            else:
                if foreign is not None:
                    segment.foreign = f"{foreign}: {FOREIGN_SEGMENT}"
                    damages.append(Damage(FOREIGN_SEGMENT, first, sealed_end - 1))
                else:
                    damages += check_sealed(seg_file, idx_file, first, sealed_end, local_low_water_mark)
                segment._next_transaction_id = sealed_end
                segment._next_offset = seg_file.size_bytes()
            segment.damages = damages
            return segment
        except BaseException:
            for file in (seg_file, idx_file):
                if file is not CLOSED_FILE:
                    file.close()
            raise

    @staticmethod
    def _read_header(
        file: DiskFile, key: uuid.UUID, partition_id: int, first: int, name: str, damages: list[Damage]
    ) -> tuple[SegmentFileHeader, str | None]:
        """The file's header, and why it is another cluster's or partition's (None when it is
        not). What else is wrong with it goes to ``damages``: the name says which transactions
        the segment holds, the control file which cluster and partition."""
        raw = pread_upto(file, HEADER_SIZE_BYTES, 0)
        try:
            header = SegmentFileHeader.from_bytes(raw)
        except FormatError as e:
            damages.append(Damage(f"{name} header: {e}"))
            stored = SegmentFileHeader.from_bytes_unchecked(raw)
            created = stored.creation_time_ms if stored is not None else 0
            header = SegmentFileHeader(FORMAT_VERSION, created, key, partition_id, first)
            if stored is None:
                return header, None
            found = stored
        else:
            found = header
        foreign = None
        for what, value, expected in (
            ("cluster key", found.key, key),
            ("partition id", found.partition_id, partition_id),
            ("first transaction id", found.first_transaction_id, first),
        ):
            if value != expected and found is header:
                damages.append(Damage(f"{name} header: {what} {value}, expected {expected}"))
            if value != expected and foreign is None and what != "first transaction id":
                foreign = f"{name} header: {what} {value}, expected {expected}"
        return header._replace(key=key, partition_id=partition_id, first_transaction_id=first), foreign

    def _recover(self, local_low_water_mark: int, *, read_only: bool = False) -> list[Damage]:
        """The original's ``Segment.recover`` for the last segment: validate from the last stable
        point, rebuild the index entries there, cut a torn tail (see ``segment_scan``).

        What this promises after a crash (kill -9, power loss), record by record as the original:
        every record kept is whole and its checksum verifies; the records kept are consecutive (the
        scan stops at the first torn, dirty or out-of-order record that no whole record follows and
        everything from there on is cut: never a gap); every record of an acknowledged append is
        kept (SUCCESS is sent only once its data is synced). An append is not atomic on one node: a
        crash inside its data write keeps a prefix of its records, whole, and cuts the rest. Whole
        appends across the replicas are the server's recovery's business (it settles a partial
        append, §2.7). A bad record that whole ones follow is not a tail: it is kept and reported.
        """
        plan = plan_recovery(self._seg_file, self._idx_file, self.first_transaction_id, local_low_water_mark)
        self._next_transaction_id = plan.next_transaction_id
        self._next_offset = plan.next_offset
        if read_only:
            self.repairs = planned_repairs(
                self.seg_path.name, self._seg_file, self._idx_file, self.first_transaction_id, plan
            )
            return plan.damages
        for first, entries in plan.index_runs:
            if entries:
                pwrite_all(self._idx_file, entries, self._index_position(first))
        self._idx_file.truncate(self._index_position(plan.next_transaction_id))
        if plan.cut:
            self._seg_file.truncate(plan.next_offset)
        self.flush()
        return plan.damages

    def _check_record(self, offset: int, transaction_id: int) -> int:
        """The size of the whole record ``transaction_id`` at ``offset``, or -1."""
        return check_record(self._seg_file, offset, transaction_id, self._seg_file.size_bytes())

    # --- state ---------------------------------------------------------------------------

    @property
    def first_transaction_id(self) -> int:
        return self.header.first_transaction_id

    @property
    def next_transaction_id(self) -> int:
        return self._next_transaction_id

    @property
    def max_transaction_id(self) -> int:
        return self._next_transaction_id - 1

    @property
    def size_bytes(self) -> int:
        return self._next_offset

    @property
    def files_open(self) -> bool:
        return self._seg_file is not CLOSED_FILE

    def _index_position(self, transaction_id: int) -> int:
        return HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (
            transaction_id - self.header.first_transaction_id
        )

    def _index_max_transaction_id(self) -> int:
        entries = (self._idx_file.size_bytes() - HEADER_SIZE_BYTES) // INDEX_ENTRY_SIZE_BYTES
        return self.header.first_transaction_id + entries - 1

    def _index_get(self, transaction_id: int) -> int:
        """The data offset of ``transaction_id`` from the index file, -1 past its end."""
        position = self._index_position(transaction_id)
        assert position >= HEADER_SIZE_BYTES, f"illegal record position: {position}"
        entry = pread_upto(self._idx_file, INDEX_ENTRY_SIZE_BYTES, position)
        return INDEX_ENTRY.unpack(entry)[0] if len(entry) == INDEX_ENTRY_SIZE_BYTES else -1

    # --- writing -------------------------------------------------------------------------

    def append(self, run: AppendRun, start: int, sync: bool = True) -> int:
        """Append ``run[start:]`` until the segment passes its threshold; return the new start.

        The caller checked the txids are consecutive; the first must be the next one here.
        ``sync`` False: the data's last sync is the caller's (:meth:`sync_data` or a whole-disk
        sync), and on its failure :meth:`cut_back`.
        """
        assert self.writable and not self.closed, f"{self.seg_path}: segment not writable"
        count = len(run)
        assert start < count
        first, offset = self._next_transaction_id, self._next_offset
        if run.transaction_id(start) != first:
            raise StorageError("transaction out of order")
        end = run.end_within(start, self._threshold_bytes - offset)
        try:
            self._write(*run.encode(start, end, offset), end - start, sync)
        except OSError:
            self.cut_back(first, offset)
            raise
        return end

    def append_record(self, txid: int, data: bytes) -> None:
        """:meth:`append` of a run of one record (``data``: its disk bytes, as
        :meth:`WireRecordRun.disk_record` makes them), the segment under its threshold (the lone
        appender's): the same check, bytes, writes and sync as :meth:`_write`'s lone branch."""
        assert self.writable and not self.closed, f"{self.seg_path}: segment not writable"
        first, offset = self._next_transaction_id, self._next_offset
        if txid != first:
            raise StorageError("transaction out of order")
        index = INDEX_ENTRY.pack(offset)
        index_at = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (first - self.header.first_transaction_id)
        seg_file, idx_file = self._seg_file, self._idx_file
        try:
            if (written := seg_file.pwrite(data, offset)) != len(data):
                _pwrite_rest(seg_file, data, offset, written)
            if (written := idx_file.pwrite(index, index_at)) != len(index):
                _pwrite_rest(idx_file, index, index_at, written)
            self._next_offset = offset + len(data)
            self._next_transaction_id = next_id = first + 1
            if next_id % CHECKPOINT_INTERVAL == 0:
                self.flush()
            else:
                seg_file.fdatasync()
        except OSError:
            self.cut_back(first, offset)
            raise

    def cut_back(self, next_transaction_id: int, next_offset: int) -> None:
        """Drop what was written from ``next_offset`` (record ``next_transaction_id``) on, in the
        files and here: an append whose write or sync failed, so the next one starts clean."""
        self._next_transaction_id, self._next_offset = next_transaction_id, next_offset
        self._idx_file.truncate(self._index_position(next_transaction_id))
        self._seg_file.truncate(next_offset)

    def sync_data(self) -> None:
        self._seg_file.fdatasync()

    def _write(self, data: bytes, index: bytes, count: int, sync: bool) -> None:
        """Write ``count`` records encoded as ``data`` from the current end, and their index
        entries: one ``pwrite`` each (split at a checkpoint), then one sync (``sync``)."""
        base_offset = self._next_offset
        first_transaction_id = self._next_transaction_id
        if count <= CHECKPOINT_INTERVAL - first_transaction_id % CHECKPOINT_INTERVAL:
            # No checkpoint inside (a lone append): the loop below's one turn, without its views.
            pwrite_all(self._seg_file, data, base_offset)
            pwrite_all(self._idx_file, index, self._index_position(first_transaction_id))
            self._next_offset = base_offset + len(data)
            self._next_transaction_id = first_transaction_id + count
            if self._next_transaction_id % CHECKPOINT_INTERVAL == 0:
                self.flush()
            elif sync:
                self._seg_file.fdatasync()
            return
        data_view, index_view = memoryview(data), memoryview(index)
        synced = False
        done = 0
        while done < count:
            # Split after the record whose next txid is a checkpoint: the original syncs there.
            cut = min(count, done + CHECKPOINT_INTERVAL - (first_transaction_id + done) % CHECKPOINT_INTERVAL)
            data_from = self._next_offset - base_offset
            data_to = (
                len(data)
                if cut == count
                else INDEX_ENTRY.unpack_from(index, cut * INDEX_ENTRY_SIZE_BYTES)[0] - base_offset
            )
            pwrite_all(self._seg_file, data_view[data_from:data_to], self._next_offset)
            pwrite_all(
                self._idx_file,
                index_view[done * INDEX_ENTRY_SIZE_BYTES : cut * INDEX_ENTRY_SIZE_BYTES],
                self._index_position(first_transaction_id + done),
            )
            self._next_offset = base_offset + data_to
            self._next_transaction_id = first_transaction_id + cut
            synced = self._next_transaction_id % CHECKPOINT_INTERVAL == 0
            if synced:
                self.flush()
            done = cut
        if not synced and sync:
            self._seg_file.fdatasync()

    def truncate(self, transaction_id: int) -> None:
        """Drop every record after ``transaction_id``: the index first, then the data, synced."""
        assert not self.closed
        if transaction_id + 1 == self._next_transaction_id:
            return
        self.check_truncate(transaction_id)
        offset = self._end_of(transaction_id)
        # Index first: a crash in between leaves records past the index, which recovery keeps
        # (the truncate did not return), never an index pointing past the data.
        self._idx_file.truncate(self._index_position(transaction_id + 1))
        self._idx_file.fsync()
        self._seg_file.truncate(offset)
        self._seg_file.fsync()
        self._next_offset = offset
        self._next_transaction_id = transaction_id + 1

    def check_truncate(self, transaction_id: int) -> None:
        """Raise unless :meth:`truncate` can keep exactly the records up to ``transaction_id``."""
        if not self.first_transaction_id <= transaction_id + 1 <= self._next_transaction_id:
            raise StorageError(f"transaction id out of range: file={self.seg_path}")

    def _end_of(self, transaction_id: int) -> int:
        """Where the data is cut to keep the records up to ``transaction_id``: the end of the
        record itself when it is whole at its own index entry (a later entry is never trusted
        over it: a damaged one could point inside its payload). A damaged record is never cut:
        the data is cut at the next record when that one is whole where its entry says, else
        not at all (only the index is), and the damaged bytes stay for the refill."""
        if transaction_id < self.first_transaction_id:
            return HEADER_SIZE_BYTES
        data_end = self._seg_file.size_bytes()
        if self.foreign is not None:
            return data_end
        offset = self._index_get(transaction_id)
        size = check_record(self._seg_file, offset, transaction_id, data_end)
        if size >= 0:
            return offset + size
        following = self._index_get(transaction_id + 1)
        lowest = max(offset, HEADER_SIZE_BYTES) + RECORD_OVERHEAD_BYTES
        if following >= lowest and check_record(self._seg_file, following, transaction_id + 1, data_end) >= 0:
            return following
        return data_end

    def flush(self) -> None:
        self._idx_file.fsync()
        self._seg_file.fsync()

    # --- reading -------------------------------------------------------------------------

    def _read_span(self, transaction_id: int, max_records: int) -> list[DiskRecord]:
        """Records ``transaction_id`` .. at most ``max_records`` (see :meth:`_read_indexed_span`);
        a first record refused for damage in its index entry alone is served from the data
        (:meth:`_located_record`)."""
        try:
            return self._read_indexed_span(transaction_id, max_records)
        except CorruptRecordError as e:
            located = self._located_record(transaction_id)
            if located is None:
                raise
            if transaction_id not in self._located:
                self._located.add(transaction_id)
                log.warning(
                    "%s; served from the data, where it is whole: refill its segment from a healthy "
                    "replica (waltz storage recover-partition)",
                    e,
                )
            return [located]

    def _located_record(self, transaction_id: int) -> DiskRecord | None:
        """Record ``transaction_id`` whole in the data where its damaged index entry does not say.

        The index is derived from the data: a record begins where the whole record before it
        ends (the first at the data's first byte). Found there whole (its txid, CRC and data
        checksum, as every read checks), and ending exactly where the next index entry (or the
        data) says the next record begins, it is the record those two entries bracket: bytes of
        a dead session's record left past an index cut are not. With rot in an index entry on
        the one replica that still held a committed record whole, refusing it stalled every
        recovery for good (the simulator's seeds 1902 and 4405 of issue 32).
        """
        if (
            self.foreign is not None
            or not self.first_transaction_id <= transaction_id < self._next_transaction_id
        ):
            return None
        data_end = self._next_offset
        if transaction_id == self.first_transaction_id:
            offset = HEADER_SIZE_BYTES
        else:
            previous = self._index_get(transaction_id - 1)
            previous_size = check_record(self._seg_file, previous, transaction_id - 1, data_end)
            if previous_size < 0:
                return None
            offset = previous + previous_size
        size = check_record(self._seg_file, offset, transaction_id, data_end)
        if size < 0:
            return None
        following = (
            self._index_get(transaction_id + 1)
            if transaction_id + 1 < self._next_transaction_id
            else data_end
        )
        if offset + size != following:
            return None
        parsed = read_record(pread_upto(self._seg_file, size, offset), 0)
        return parsed if isinstance(parsed, DiskRecord) else None

    def _read_indexed_span(self, transaction_id: int, max_records: int) -> list[DiskRecord]:
        """Records ``transaction_id`` .. at most ``max_records``, read with two preads.

        Every record is checked (found where its index entry says, its CRC over header and data,
        its data checksum) before it leaves: a bad one ends the span before it, or raises
        :class:`CorruptRecordError` when it is the first one asked for. Damage in the index is
        refused the same way, never read as a record.
        """
        assert self.files_open and transaction_id >= self.first_transaction_id
        count = min(max_records, self._next_transaction_id - transaction_id)
        if count <= 0:
            return []
        if self.foreign is not None:
            partition_id = self.header.partition_id
            raise CorruptRecordError(partition_id, transaction_id, self.seg_path, -1, self.foreign)
        raw_index = pread_upto(
            self._idx_file, INDEX_ENTRY_SIZE_BYTES * count, self._index_position(transaction_id)
        )
        whole_entries = len(raw_index) // INDEX_ENTRY_SIZE_BYTES * INDEX_ENTRY_SIZE_BYTES
        offsets = [entry for (entry,) in INDEX_ENTRY.iter_unpack(raw_index[:whole_entries])]
        # An entry that cannot be where its record starts (outside the data, or not after the
        # previous record) ends the span: the record it should locate is refused below.
        data_end = self._next_offset
        usable = 0
        while usable < len(offsets) and HEADER_SIZE_BYTES <= offsets[usable] < data_end:
            if usable and offsets[usable] < offsets[usable - 1] + RECORD_OVERHEAD_BYTES:
                break
            usable += 1
        if usable == 0:
            where = offsets[0] if offsets else -1
            missing = (
                "its index entry is missing" if not offsets else "its index entry points outside the data"
            )
            raise CorruptRecordError(self.header.partition_id, transaction_id, self.seg_path, where, missing)
        if offsets[usable - 1] - offsets[0] > MAX_READ_SPAN_BYTES:
            # Records end where the next begins: keep those that end within the budget.
            usable = max(1, bisect.bisect_right(offsets, offsets[0] + MAX_READ_SPAN_BYTES, 0, usable) - 1)
        offsets = offsets[:usable]
        last_txid = transaction_id + usable - 1
        end = self._span_end(last_txid, offsets[-1])
        if (
            end - offsets[0] > MAX_READ_SPAN_BYTES
            and check_record(self._seg_file, offsets[0], transaction_id, data_end) < 0
        ):
            # Checked in chunks first: a damaged length field must not load a segment's worth.
            raise CorruptRecordError(
                self.header.partition_id, transaction_id, self.seg_path, offsets[0], "not whole"
            )
        buf = pread_upto(self._seg_file, end - offsets[0], offsets[0])
        result: list[DiskRecord] = []
        for i, offset in enumerate(offsets):
            parsed = read_record(buf, offset - offsets[0])
            what: str | None = None
            if not isinstance(parsed, DiskRecord):
                what = parsed.reason
            elif parsed.record.transaction_id != transaction_id + i:
                what = f"the bytes at its index offset say transaction {parsed.record.transaction_id}"
            elif not parsed.record_checksum_ok:
                what = "record checksum mismatch"
            elif not parsed.checksum_ok:
                what = "data checksum mismatch"
            if what is not None:
                if result:
                    break  # serve the good records before it; a read starting at it fails
                raise CorruptRecordError(
                    self.header.partition_id, transaction_id, self.seg_path, offset, what
                )
            assert isinstance(parsed, DiskRecord)
            result.append(parsed)
        return result

    def _span_end(self, transaction_id: int, offset: int) -> int:
        """Where the record ``transaction_id`` at ``offset`` ends: the next index entry when it is
        plausible, else what the record's own header says (bounded by the data)."""
        data_end = self._next_offset
        if transaction_id < self.max_transaction_id:
            following = self._index_get(transaction_id + 1)
            if offset + RECORD_OVERHEAD_BYTES <= following <= data_end:
                return following
        head = pread_upto(self._seg_file, RECORD_HEADER_SIZE_BYTES, offset)
        length = RECORD_HEADER.unpack(head)[4] if len(head) == RECORD_HEADER_SIZE_BYTES else 0
        return min(data_end, offset + RECORD_OVERHEAD_BYTES + max(0, length))

    def whole_records(self, transaction_id: int, count: int) -> dict[int, Record]:
        """The records of ``transaction_id`` .. ``+count-1`` this segment holds whole, by txid
        (the damaged ones are left out)."""
        found: dict[int, Record] = {}
        if self.foreign is not None:
            return found
        txid, end = transaction_id, min(transaction_id + count, self._next_transaction_id)
        while txid < end:
            try:
                span = self._read_span(txid, end - txid)
            except CorruptRecordError:
                txid += 1
                continue
            assert span, "a span inside the segment is never empty"
            found.update((r.record.transaction_id, r.record) for r in span)
            txid += len(span)
        return found

    def read_records(self, transaction_id: int, max_records: int) -> list[Record]:
        return [r.record for r in self._read_span(transaction_id, max_records)]

    def read_wire(self, transaction_id: int, max_records: int, max_bytes: int) -> WireRecords:
        """The records as a record list carries them, as far as they check out by columns
        (``wire_span``) and no chunk starts past ``max_bytes``; where that stops,
        :meth:`read_records` decides."""
        assert self.files_open and transaction_id >= self.first_transaction_id
        if self.foreign is not None:
            return WireRecords(0, ())
        return read_wire_span(
            self._seg_file,
            self._idx_file,
            self.first_transaction_id,
            self._next_transaction_id,
            self._next_offset,
            transaction_id,
            max_records,
            max_bytes,
        )

    def read_record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        return [r.record.record_header() for r in self._read_span(transaction_id, max_records)]

    def checksum(self, crc: int) -> int:
        """Continue an unsigned running CRC-32 over the data after the header (replica compare)."""
        assert self.files_open
        return file_crc32(self._seg_file, HEADER_SIZE_BYTES, crc)

    # --- file handles --------------------------------------------------------------------

    def ensure_open(self) -> None:
        """Reopen the files of a sealed segment the LRU cache closed."""
        assert not self.closed
        if not self.files_open:
            seg_file = self._disk.open(self.seg_path)
            try:
                self._idx_file = self._disk.open(self.idx_path)
            except BaseException:
                seg_file.close()
                raise
            self._seg_file = seg_file

    def close_files(self) -> None:
        """Close the descriptors but keep the segment usable (``ensure_open`` reopens)."""
        if self.files_open:
            self._idx_file.close()
            self._seg_file.close()
            self._idx_file = self._seg_file = CLOSED_FILE

    def close(self) -> None:
        if self.files_open and self.writable:
            self.flush()
        self.close_files()
        self.closed = True
        self.writable = False

    def delete(self) -> None:
        """Close and remove both files, data first as the original (partition open removes an
        index left behind by a crash in between)."""
        self.close()
        self._disk.unlink(self.seg_path, missing_ok=True)
        self._disk.unlink(self.idx_path, missing_ok=True)


def _pwrite_rest(file: DiskFile, data: bytes, offset: int, written: int) -> None:
    """The rest of a ``pwrite`` of ``data`` at ``offset`` that took ``written`` bytes (``pwrite_all``)."""
    assert written > 0, "pwrite wrote nothing"
    pwrite_all(file, memoryview(data)[written:], offset + written)
