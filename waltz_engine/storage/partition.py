"""A partition on disk: its segments, the current (writable) one, and the operations a storage
node serves for it (reference §1.2 request semantics, §1.5 rollover, §1.6 open).

Thread-safety contract: every public method takes the partition's lock, so calls from
several threads are safe and serialize per partition. The intended use is one worker
thread per partition (as the original's "Storage-P<id>" task) plus occasional admin calls;
blocking I/O (fsync) happens under the lock, so do not call from an event loop thread.
Session fencing (the in-memory session id, ASSIGNED/AVAILABLE permission checks) belongs
to the node that routes requests here, not to this class.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.disk.record_run import AppendRun, JoinedRuns, RecordList, WireRecordRun
from waltz_engine.storage.constants import (
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    now_ms,
    segment_paths,
)
from waltz_engine.storage.control_file import PartitionInfo, SessionInfo
from waltz_engine.storage.damage import DamageLog, SegmentDamage
from waltz_engine.storage.file_system import OS_DISK, Disk
from waltz_engine.storage.held_append import HeldAppends
from waltz_engine.storage.lru import LRUCache
from waltz_engine.storage.partition_files import clean_interrupted_files, segment_paths_read_only
from waltz_engine.storage.refill import RefillCopy
from waltz_engine.storage.refill_checks import copy_headers, refill_target
from waltz_engine.storage.segment import CorruptRecordError, Segment
from waltz_engine.storage.segment_files import create_segment_files, first_transaction_id_of
from waltz_engine.storage.segment_finder import find_segment
from waltz_engine.storage.tier.reads import TierPending, TierSegments
from waltz_engine.storage.wire_span import RECORD_LIST_MAX_BYTES, WireRecords, encode_wire_records
from waltz_engine.wire.primitives import Buffer
from waltz_engine.zk.retention import BelowRetainedStartError

log = logging.getLogger(__name__)


class Partition(HeldAppends):
    """An open partition directory. Create with :meth:`open`; close when done."""

    def __init__(
        self,
        key: uuid.UUID,
        directory: Path,
        info: PartitionInfo,
        segment_size_threshold_bytes: int,
        segment_cache_capacity: int,
        clock_ms: Callable[[], int],
        disk: Disk,
    ) -> None:
        assert segment_size_threshold_bytes > 0 and segment_cache_capacity >= 0
        self._disk = disk
        self.key = key
        self.directory = directory
        self.info = info
        self._threshold_bytes = segment_size_threshold_bytes
        self._clock_ms = clock_ms
        self._segments: list[Segment] = []
        self._cache: LRUCache[Segment] = LRUCache(segment_cache_capacity, self._evict)
        self._lock = threading.Lock()
        self._closed = False
        self.damage = DamageLog()
        # A damaged segment's copy being written from a healthy replica (see ``refill``).
        self._refill: RefillCopy | None = None
        # Head segments evicted to the tier, read back on demand (``waltz_engine.storage.tier``).
        self.tier: TierSegments | TierPending | None = None
        # A read-only open (``read_only``): what an open for writing would change, one line each
        # (the kept damage is in ``damage`` as for any open). Never written to.
        self.read_only = False
        self.findings: list[str] = []

    @classmethod
    def open(
        cls,
        key: uuid.UUID,
        directory: Path,
        info: PartitionInfo,
        *,
        segment_size_threshold_bytes: int = DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
        segment_cache_capacity: int = DEFAULT_SEGMENT_CACHE_CAPACITY,
        clock_ms: Callable[[], int] = now_ms,
        disk: Disk = OS_DISK,
        read_only: bool = False,
    ) -> Partition:
        """Open (recovering) every segment in ``directory``; create segment 0 if there is none.

        ``read_only`` (with a read-only ``disk``): check the same files the same way and write
        nothing; what the open would have changed is in ``findings``. Only for reading:
        ``checksum``, ``segments``, ``damage_report``.
        """
        partition = cls(
            key, directory, info, segment_size_threshold_bytes, segment_cache_capacity, clock_ms, disk
        )
        partition.read_only = read_only
        try:
            partition._load()
        except BaseException:
            for segment in partition._segments:
                segment.close_files()
            raise
        return partition

    def _load(self) -> None:
        directory = self.directory
        if self.read_only:
            self._check_read_only()
            return
        self._disk.mkdir(directory)
        clean_interrupted_files(directory, self._disk)
        local_low_water_mark = self.info.current.local_low_water_mark
        seg_paths = sorted(self._disk.glob(directory, "*" + SEGMENT_SUFFIX), key=first_transaction_id_of)
        if not seg_paths:
            seg_path, idx_path = segment_paths(directory, 0)
            create_segment_files(
                self.key, self.partition_id, seg_path, idx_path, 0, self._clock_ms, self._disk
            )
            seg_paths = [seg_path]
        self._open_segments(seg_paths, local_low_water_mark)
        self._segments[-1].writable = True
        for damaged in self.damage_report():
            log.warning(
                "partition %d: %s; its bytes are kept and its damaged records are not served (a record "
                "whole in the data, only its index entry damaged, is): refill it from a healthy "
                "replica (waltz storage recover-partition)",
                self.partition_id,
                damaged.describe(),
            )

    def _check_read_only(self) -> None:
        """The read-only open: what ``_load`` would find, clean, create and recover, written down."""
        seg_paths, findings = segment_paths_read_only(self.directory, self._disk)
        self.findings += findings
        if not seg_paths:
            return
        local_low_water_mark = self.info.current.local_low_water_mark
        self._open_segments(seg_paths, local_low_water_mark)
        for segment in self._segments:
            self.findings += segment.repairs
        last = self._segments[-1].max_transaction_id
        if last < local_low_water_mark:
            self.findings.append(
                f"the segments end at transaction {last}, below the local low-water mark "
                f"{local_low_water_mark} (segments missing)"
            )

    def _open_segments(self, seg_paths: list[Path], local_low_water_mark: int) -> None:
        for i, seg_path in enumerate(seg_paths):
            # A sealed segment ends where the next one starts: checked, never written, so damage
            # in it can neither cut records nor leave a gap between segments.
            sealed_end = first_transaction_id_of(seg_paths[i + 1]) if i + 1 < len(seg_paths) else None
            segment = self._open_segment(
                seg_path, seg_path.with_suffix(INDEX_SUFFIX), local_low_water_mark, sealed_end
            )
            previous = self._segments[-1] if self._segments else None
            assert previous is None or segment.first_transaction_id == previous.next_transaction_id
            self._segments.append(segment)
            self.damage.add(segment.first_transaction_id, segment.damages)
            if len(self._segments) > 1:
                self._cache.touch(self._segments[-2])

    def _evict(self, segment: Segment) -> None:
        if not segment.writable and not segment.closed:
            segment.close_files()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"partition {self.partition_id} is closed")

    # --- requests ------------------------------------------------------------------------

    def max_transaction_id(self) -> int:
        with self._lock:
            self._check_open()
            return self._current.max_transaction_id

    def first_transaction_id(self) -> int:
        """The retained start: the first txid the partition holds (above 0 once retention ran)."""
        with self._lock:
            self._check_open()
            return self._start()

    def span(self) -> tuple[int, int]:
        """(:meth:`first_transaction_id`, :meth:`max_transaction_id`) in one look (one lock)."""
        with self._lock:
            self._check_open()
            return self._start(), self._current.max_transaction_id

    def _start(self) -> int:
        tier_first = self.tier.first_transaction_id if self.tier is not None else None
        return self._segments[0].first_transaction_id if tier_first is None else tier_first

    def _check_retained(self, transaction_id: int) -> None:
        start = self._start()
        if 0 <= transaction_id < start:
            if self.tier is not None:
                self.tier.check_known()  # evicted transactions are not below the retained start
            raise BelowRetainedStartError(self.partition_id, transaction_id, start)

    def last_session_info(self) -> SessionInfo:
        return self.info.last_session_info()

    def append(self, records: Sequence[Record] | WireRecordRun | JoinedRuns) -> None:
        """Append consecutive records starting at the next txid; durable when this returns.

        ``records``: ``Record`` objects, or a request's records in the bytes they came in (the
        storage node's append path: no object per record), written the same."""
        run: AppendRun = records if isinstance(records, (WireRecordRun, JoinedRuns)) else RecordList(records)
        with self._lock:
            self._check_open()
            self._abort_refill()
            current = self._current
            if current.foreign is not None:
                raise StorageError(
                    f"partition {self.partition_id}: not appending to {current.seg_path}: "
                    f"{current.foreign}; refill it (waltz storage recover-partition)"
                )
            if not run.consecutive_from(current.next_transaction_id):
                raise StorageError("transaction out of order")
            self._append_run(run)

    def _append_run(self, run: AppendRun) -> None:
        """Under the lock: ``run``, consecutive from the next txid, written and synced."""
        start = 0
        count = len(run)
        while start < count:
            if self._current.size_bytes > self._threshold_bytes:
                self._roll_over()
            start = self._current.append(run, start)

    def _roll_over(self) -> None:
        sealed = self._current
        sealed.flush()
        # Sealed only once its successor exists: a creation the disk refused (full) left the last
        # segment sealed and in the cache, which closed its files on a later eviction, and every
        # append after failed on them (EBADF) until the node restarted, with room again (issue 32:
        # the simulator's seed 43364).
        segment = self._new_segment(sealed.next_transaction_id)
        sealed.writable = False
        self._cache.touch(sealed)
        self._segments.append(segment)

    def _open_segment(
        self, seg_path: Path, idx_path: Path, local_low_water_mark: int, sealed_end: int | None
    ) -> Segment:
        return Segment.open(
            self.key,
            self.partition_id,
            seg_path,
            idx_path,
            local_low_water_mark,
            self._threshold_bytes,
            sealed_end=sealed_end,
            disk=self._disk,
            read_only=self.read_only,
        )

    def _new_segment(self, first: int) -> Segment:
        """A new, empty, writable last segment starting at ``first``."""
        seg_path, idx_path = segment_paths(self.directory, first)
        create_segment_files(
            self.key, self.partition_id, seg_path, idx_path, first, self._clock_ms, self._disk
        )
        segment = self._open_segment(seg_path, idx_path, -1, None)
        segment.writable = True
        return segment

    def truncate(self, transaction_id: int) -> int:
        """Keep transactions up to ``transaction_id``; return the new max txid."""
        with self._lock:
            self._check_open()
            if transaction_id < -1:
                raise StorageError(f"transaction id out of range: {transaction_id}")
            if transaction_id == -1 and self._segments[0].first_transaction_id > 0:
                # Nothing kept of a log whose local head is gone (in the tier, or removed): it
                # begins again at 0, no gap (a replica moved back onto a node that kept its
                # files, cut to its low-water mark -1: issue 32, the simulator's seed 12). A
                # truncate to a txid below the start is refused (a server that means "keep
                # nothing" asks -1: ``recovery._truncate``).
                self._empty()
                return -1
            # Records removed by retention cannot come back: refuse rather than leave a gap.
            self._check_retained(transaction_id + 1)
            if self._current.max_transaction_id <= transaction_id:
                return self._current.max_transaction_id
            if transaction_id + 1 < self._segments[0].first_transaction_id:
                return self._cut_into_tier(transaction_id)  # in the tier: ``_check_retained``
            self._abort_refill()
            # Checked before any segment goes, so a refused truncate changes nothing.
            kept = len(self._segments)
            while kept > 1 and transaction_id + 1 < self._segments[kept - 1].first_transaction_id:
                kept -= 1
            current = self._segments[kept - 1]
            current.check_truncate(transaction_id)
            if self.tier is not None:
                self.tier.note_cut(transaction_id + 1)  # copies holding cut records: void
            if len(self._segments) > kept:
                while len(self._segments) > kept:
                    doomed = self._segments.pop()
                    self._cache.remove(doomed)
                    doomed.delete()
                # Made durable before the kept segment is cut: an unlink outlives a power loss only
                # once its directory is synced. Before, the removed segments came back behind the
                # cut one, with the dirty tail the truncate had removed, and the records appended
                # after the cut were unreadable in a segment now sealed (issue 32: the simulator's
                # seed 30296).
                self._disk.fsync_directory(self.directory)
            self._cache.remove(current)
            current.ensure_open()
            current.writable = True
            current.truncate(transaction_id)
            self.damage.forget_after(transaction_id)
            return current.max_transaction_id

    def take_tier_cut(self) -> int | None:
        """The lowest txid a truncate cut since the tier's last round (``TierSegments.note_cut``)."""
        with self._lock:
            return self.tier.take_cut() if isinstance(self.tier, TierSegments) else None

    def set_low_water_mark(self, session_id: int, low_water_mark: int) -> None:
        """Start a session: persist its low-water mark and our max txid as local low-water mark."""
        with self._lock:
            self._check_open()
            current = self._current
            if current.max_transaction_id > low_water_mark:
                raise StorageError("low-water mark is lower than the max transaction id")
            current.flush()
            self.info.set_low_water_mark(session_id, low_water_mark, current.max_transaction_id)

    def record(self, transaction_id: int) -> Record | None:
        records = self.records(transaction_id, 1)
        return records[0] if records else None

    def record_header(self, transaction_id: int) -> RecordHeader | None:
        headers = self.record_headers(transaction_id, 1)
        return headers[0] if headers else None

    def records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Records ``transaction_id`` .. ``+max_records-1``, stopping at the first missing one."""
        result: list[Record] = []
        with self._lock:
            self._check_open()
            self._check_retained(transaction_id)
            while len(result) < max_records:
                segment = self._segment_for_read(transaction_id + len(result))
                if segment is None:
                    break
                try:
                    result += segment.read_records(transaction_id + len(result), max_records - len(result))
                except CorruptRecordError as e:
                    if not result:
                        self._refuse(segment, e)
                    break  # a short answer; the next read, starting at the bad record, fails
        return result

    def records_wire(
        self, transaction_id: int, max_records: int, max_bytes: int = RECORD_LIST_MAX_BYTES
    ) -> WireRecords:
        """:meth:`records` as the bytes of a RECORD_LIST answer's record list, the same bytes:
        read by columns from the segments, and record by record only where that stops (a
        damaged record, which the exact reader serves up to or refuses, as in :meth:`records`;
        a record larger than a chunk). Short once ``max_bytes`` of records are read: the asker
        goes on from there, as at the log's end."""
        chunks: list[Buffer] = []
        count = 0
        wire_bytes = 0
        with self._lock:
            self._check_open()
            self._check_retained(transaction_id)
            while count < max_records and wire_bytes < max_bytes:
                segment = self._segment_for_read(transaction_id + count)
                if segment is None:
                    break
                fast = segment.read_wire(transaction_id + count, max_records - count, max_bytes - wire_bytes)
                chunks += fast.chunks
                count += fast.num_records
                wire_bytes += sum(memoryview(chunk).nbytes for chunk in fast.chunks)
                next_txid = transaction_id + count
                if (
                    count == max_records
                    or wire_bytes >= max_bytes
                    or next_txid == segment.next_transaction_id
                ):
                    continue
                try:
                    # One record: the columns take over again from the next one.
                    exact = segment.read_records(next_txid, 1)
                except CorruptRecordError as e:
                    if not count:
                        self._refuse(segment, e)
                    break  # a short answer; the next read, starting at the bad record, fails
                if not exact:
                    break
                encoded = encode_wire_records(exact)
                chunks.append(encoded)
                count += len(exact)
                wire_bytes += len(encoded)
        return WireRecords(count, chunks)

    def record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        result: list[RecordHeader] = []
        with self._lock:
            self._check_open()
            self._check_retained(transaction_id)
            while len(result) < max_records:
                segment = self._segment_for_read(transaction_id + len(result))
                if segment is None:
                    break
                try:
                    result += segment.read_record_headers(
                        transaction_id + len(result), max_records - len(result)
                    )
                except CorruptRecordError as e:
                    if not result:
                        self._refuse(segment, e)
                    break  # a short answer; the next read, starting at the bad record, fails
        return result

    def _refuse(self, segment: Segment, error: CorruptRecordError) -> NoReturn:
        """A read met a damaged record: remember it (reported until refilled), then refuse it."""
        if self.damage.add_found_on_read(segment.first_transaction_id, error.transaction_id, error.what):
            log.warning(
                "partition %d: %s; not served: refill its segment from a healthy replica "
                "(waltz storage recover-partition)",
                self.partition_id,
                error,
            )
        else:
            log.warning("not serving it: %s", error)
        raise error

    def _segment_for_read(self, transaction_id: int) -> Segment | None:
        self._check_open()
        if self.tier is not None and transaction_id < self._segments[0].first_transaction_id:
            return self.tier.segment_for(transaction_id)
        segment = find_segment(self._segments, transaction_id)
        if segment is not None and not segment.writable:
            segment.ensure_open()
            self._cache.touch(segment)
        return segment

    def checksum(self) -> int:
        """CRC-32 over every segment's data after its header (the original's replica check)."""
        with self._lock:
            self._check_open()
            crc = 0
            for segment in self._segments:
                was_open = segment.files_open
                segment.ensure_open()
                crc = segment.checksum(crc)
                if not was_open:
                    segment.close_files()
            return to_signed32(crc)

    # --- damage and refills ----------------------------------------------------------------

    def damage_report(self) -> list[SegmentDamage]:
        """The damaged segments, oldest first. Takes no partition lock (an fsync may hold it): for
        ``/health`` and the metrics, read on the event loop."""
        ends = {s.first_transaction_id: s.max_transaction_id for s in list(self._segments)}
        return self.damage.report(lambda first: ends.get(first, -1))

    def head_segment_spans(self, max_spans: int) -> dict[str, Any]:
        """The oldest ``max_spans`` local segments' [first, max] txids and how many segments there
        are, for the metrics gauge the dry runs read (``waltz retention set --dry-run``). Takes no
        partition lock, as :meth:`damage_report`."""
        segments = list(self._segments)
        spans = [[s.first_transaction_id, s.max_transaction_id] for s in segments[:max_spans]]
        return {"spans": spans, "segments": len(segments)}

    def damage_json(self) -> list[dict[str, Any]]:
        """:meth:`damage_report` for the metrics gauge (``waltz storage list`` reads it)."""
        return [d.to_json() for d in self.damage_report()]

    def refill(self, records: Sequence[Record]) -> bool:
        """Offline recovery of a damaged segment: ``records`` are transactions this partition holds,
        sent from a healthy replica. True once the segment was replaced. Its records come in order
        from its first txid (a batch starting there starts the copy again); each record this
        partition holds whole must be the one sent, or nothing is replaced (the replicas disagree).
        The last one in, the copy is swapped in (``refill.py``); until then nothing changes."""
        with self._lock:
            self._check_open()
            segment = refill_target(self.partition_id, self._segments, records)
            first = records[0].transaction_id
            copy = self._refill_copy(segment, first)
            if not segment.writable:
                segment.ensure_open()
                self._cache.touch(segment)
            mine = segment.whole_records(first, len(records))
            for record in records:
                held = mine.get(record.transaction_id)
                if held is not None and held != record:
                    self._abort_refill()
                    raise StorageError(
                        f"partition {self.partition_id}: transaction {record.transaction_id} held whole "
                        "here differs from the one sent: the replicas disagree; nothing was replaced"
                    )
            copy.append(records)
            if copy.next_transaction_id <= segment.max_transaction_id:
                return False
            self._swap_in(segment, copy)
            return True

    def _refill_copy(self, segment: Segment, first: int) -> RefillCopy:
        copy = self._refill
        start = segment.first_transaction_id
        if first == start:
            self._abort_refill()
            self._refill = copy = RefillCopy.begin(
                segment.seg_path,
                segment.idx_path,
                start,
                *copy_headers(self._disk, segment, self._clock_ms),
                self._disk,
            )
            return copy
        if copy is None or copy.seg_path != segment.seg_path or copy.next_transaction_id != first:
            going = copy is not None and copy.seg_path == segment.seg_path
            expected = f" or go on at {copy.next_transaction_id}" if copy is not None and going else ""
            raise StorageError(
                f"partition {self.partition_id}: a refill of segment {start}-{segment.max_transaction_id} "
                f"starts at transaction {start}{expected}, not {first}"
            )
        return copy

    def _swap_in(self, segment: Segment, copy: RefillCopy) -> None:
        position = self._segments.index(segment)
        last = position == len(self._segments) - 1
        self._refill = None
        try:
            copy.swap_in()
        except BaseException:
            if copy.data_swapped:
                # Half swapped: the copy's index must follow its data, which only the next open
                # does (``clean_interrupted_refills``). Nothing is served from mixed files meanwhile.
                log.error(
                    "partition %d: refill of %s interrupted; reopen the partition",
                    self.partition_id,
                    segment.seg_path.name,
                )
                self._close_for_reopen()
            else:
                copy.abort()
            raise
        replaced = self._open_segment(
            segment.seg_path,
            segment.idx_path,
            self.info.current.local_low_water_mark,
            None if last else segment.next_transaction_id,
        )
        replaced.writable = last
        self._cache.remove(segment)
        segment.close()
        self._segments[position] = replaced
        if not last:
            self._cache.touch(replaced)
        self.damage.forget_segment(replaced.first_transaction_id)
        self.damage.add(replaced.first_transaction_id, replaced.damages)
        log.info(
            "partition %d: segment %d-%d refilled from a healthy replica%s",
            self.partition_id,
            replaced.first_transaction_id,
            replaced.max_transaction_id,
            "" if not replaced.damages else f", still damaged: {replaced.damages}",
        )

    def _close_for_reopen(self) -> None:
        self._closed = True
        for segment in self._segments:
            self._cache.remove(segment)
            segment.close_files()
            segment.closed = True

    def _abort_refill(self) -> None:
        """Any other write ends a refill in progress: its copy would no longer match."""
        if self._refill is not None:
            log.warning("partition %d: refill of %s abandoned", self.partition_id, self._refill.seg_path.name)
            self._refill.abort()
            self._refill = None

    @property
    def disk(self) -> Disk:
        """The file system seam the partition's files are reached through."""
        return self._disk

    @property
    def segments(self) -> list[tuple[int, int]]:
        """(first, max) txid of each segment, oldest first: for tools and tests."""
        with self._lock:
            return [(s.first_transaction_id, s.max_transaction_id) for s in self._segments]

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._abort_refill()
            for segment in self._segments:
                self._cache.remove(segment)
                segment.close()
            if self.tier is not None:
                self.tier.close()

    def delete_segments(self) -> None:
        """Remove every segment's files (unassignment with deleteStorageFiles)."""
        with self._lock:
            self._closed = True
            self._abort_refill()
            for segment in self._segments:
                self._cache.remove(segment)
                segment.delete()
            self._segments.clear()
