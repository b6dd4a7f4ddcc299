"""The head of a partition's log: what retention and the tier remove from it, and a late start
(an empty replica filled after retention removed the head everywhere else).

A part of :class:`waltz_engine.storage.partition.Partition`, kept apart for size; it works on
the partition's state under the partition's lock, as every public method there does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.storage.control_file import PartitionInfo
from waltz_engine.storage.damage import DamageLog
from waltz_engine.storage.file_system import Disk
from waltz_engine.storage.lru import LRUCache
from waltz_engine.storage.segment import Segment
from waltz_engine.storage.tier.manifest import TierSegment
from waltz_engine.storage.tier.reads import TierPending, TierSegments, kill_point
from waltz_engine.zk.retention import removable_head_segments

log = logging.getLogger("waltz_engine.storage.partition")


class PartitionHead:
    """Retention's and the tier's operations on the oldest segments, and ``start_at``."""

    # The partition's state (``Partition.__init__`` sets it).
    directory: Path
    info: PartitionInfo
    tier: TierSegments | TierPending | None
    damage: DamageLog
    _disk: Disk
    _lock: threading.Lock
    _segments: list[Segment]
    _cache: LRUCache[Segment]

    @property
    def partition_id(self) -> int:
        return self.info.partition_id

    @property
    def _current(self) -> Segment:
        return self._segments[-1]

    def _check_open(self) -> None:
        raise NotImplementedError

    def _abort_refill(self) -> None:
        raise NotImplementedError

    def _new_segment(self, first: int) -> Segment:
        raise NotImplementedError

    def remove_head_segments(self, bound: int) -> list[tuple[int, int]]:
        """Remove the oldest segments lying wholly below ``bound`` and the local low-water mark + 1
        (never the current one), evicted ones too (under the same two limits); return their
        (first, max) txids.

        Oldest first, each ``.seg`` before its ``.idx`` (see :meth:`_drop_head`). The directory
        is synced so that a removal, once reported, stays done.
        """
        with self._lock:
            self._check_open()
            spans = [(s.first_transaction_id, s.max_transaction_id) for s in self._segments]
            local_low_water_mark = self.info.current.local_low_water_mark
            count = removable_head_segments(spans, bound, local_low_water_mark)
            if count:
                self._abort_refill()
            for _ in range(count):
                self._drop_head()
            if count:
                self._disk.fsync_directory(self.directory)
            # The evicted segments too only at or below the mark: they were evicted at or below
            # it, but an unassignment resets the mark to -1 and keeps the files and the manifest,
            # so a replica assigned again (a move's target) serves them above its mark until a
            # session sets one (issue 32: the simulator's seed 2932, bank seed 224).
            end = min(bound, self._segments[0].first_transaction_id, local_low_water_mark + 1)
            evicted = self.tier.forget_below(end) if self.tier is not None else []
            return evicted + spans[:count]

    def _empty(self) -> list[tuple[int, int]]:
        """Under the lock: drop every segment, local and evicted, and begin again at segment 0
        (``truncate(-1)`` of a log whose local head is gone). A replica that fell behind the
        others' retained start while its own head was removed too is emptied so, then filled
        from the retained start (:meth:`start_at`); a replica moved back onto a node that kept
        its files likewise. The segments go oldest first, then segment 0 is created: a crash in
        between leaves no segment, and :meth:`open` recreates segment 0, the state this ends in."""
        self._abort_refill()
        held = self._current.max_transaction_id
        spans = [(s.first_transaction_id, s.max_transaction_id) for s in self._segments]
        evicted = self.tier.forget_below(held + 1) if self.tier is not None else []
        if self.tier is not None:
            self.tier.note_cut(0)
        while self._segments:
            self._drop_head()
        self.damage.forget_after(-1)  # the evicted segments' too (see ``_cut_into_tier``)
        self._disk.fsync_directory(self.directory)
        self._segments.append(self._new_segment(0))
        return evicted + spans

    def _cut_into_tier(self, transaction_id: int) -> int:
        """Under the lock: ``truncate(transaction_id)`` of a log whose records from
        ``transaction_id + 1`` on begin in a segment evicted to the tier; the max txid kept.

        The tier's copies are never written again, so the evicted segment holding
        ``transaction_id + 1`` goes whole, with everything after it (evicted and local), and the
        local log begins again, empty, where that segment began: the records of it up to
        ``transaction_id`` (at most one segment of them) are dropped as well, and the reply says
        so (a max txid below ``transaction_id``, as from a replica that held fewer records); the
        server's recovery copies them back from another replica. The original replies
        min(max txid, ``transaction_id``), but it has no tier. Refused, the cut stalled every
        recovery for good: a replica whose last store session set its low-water mark (so the
        tier evicted up to it) and ended before ZooKeeper recorded that is cut to its older
        closing mark by each later session (issue 32: the simulator's seeds 399 and 30447).

        Newest segment first, then the directory is synced and the new segment created: a crash
        in between leaves a shorter log (the tail cut, as a truncate may be) or none, which
        :meth:`open` makes segment 0, emptied as :meth:`_empty` leaves it; both are filled again.
        """
        assert isinstance(self.tier, TierSegments)
        gone = self.tier.forget_from(transaction_id + 1)
        assert gone and gone[0][0] <= transaction_id + 1 < self._segments[0].first_transaction_id
        self._abort_refill()
        while self._segments:
            doomed = self._segments.pop()
            self._cache.remove(doomed)
            doomed.delete()
        self._disk.fsync_directory(self.directory)
        kill_point("cut")
        start = gone[0][0]
        # The damage found in the cut segments, evicted ones too (a rotten tier copy read): kept,
        # it was reported against the segments filled again at the same txids.
        self.damage.forget_after(start - 1)
        self._segments.append(self._new_segment(start))
        log.warning(
            "partition %d: truncate to %d cuts segment %d..%d, in the tier only: the log begins again "
            "at %d, to be filled from another replica",
            self.partition_id,
            transaction_id,
            gone[0][0],
            gone[0][1],
            start,
        )
        return start - 1

    def _drop_head(self) -> None:
        """Remove the oldest segment's files (``.seg`` first: :meth:`open` removes a lone index)."""
        doomed = self._segments.pop(0)
        self._cache.remove(doomed)
        doomed.delete()
        self.damage.forget_segment(doomed.first_transaction_id)

    def _local_bytes(self) -> int:
        size = self._disk.file_size_bytes
        return sum(size(s.seg_path) + size(s.idx_path) for s in self._segments)

    def evict_to_tier(self, local_bytes: int, in_tier: Callable[[int, int], TierSegment | None]) -> int:
        """Remove the oldest local segments ``in_tier`` finds verified in the tier while the files
        exceed ``local_bytes`` (the last two stay), as retention removes them; how many went.

        Only segments at or below the local low-water mark: the tier's copies were uploaded at
        or below it, but a manifest outlives the replica's holding of the partition, and a
        replica moved back and filled again may hold segments of the same spans above its mark
        (issue 32: the simulator's seed 1429, where retention then forgot them, not known
        committed)."""
        with self._lock:
            self._check_open()
            assert isinstance(self.tier, TierSegments)
            removed = 0
            local_low_water_mark = self.info.current.local_low_water_mark
            cut = self.tier.cut_from
            while self._local_bytes() > local_bytes and len(self._segments) > 2:
                head = self._segments[0]
                if head.max_transaction_id > local_low_water_mark:
                    break
                if cut is not None and head.max_transaction_id >= cut:
                    # A truncate cut it after the round took the cuts (``TierSegments.note_cut``):
                    # its copy may hold the cut records. The next round voids that copy first.
                    break
                uploaded = in_tier(head.first_transaction_id, head.max_transaction_id)
                if uploaded is None:
                    break
                self._abort_refill()
                self._drop_head()
                self.tier.add_evicted(uploaded)
                removed += 1
            if removed:
                self._disk.fsync_directory(self.directory)
            return removed

    def whole_records(self, first: int, transaction_id: int, count: int) -> dict[int, Record] | None:
        """The records ``transaction_id`` .. ``+count-1`` of the local segment beginning at
        ``first`` that it holds whole, by txid (the damaged ones left out); None when no local
        segment begins there (any more). What a tier copy of a damaged segment is checked
        against before the segment is evicted for it, as a refill checks what it is sent."""
        with self._lock:
            self._check_open()
            segment = next((s for s in self._segments if s.first_transaction_id == first), None)
            if segment is None:
                return None
            if not segment.writable:
                segment.ensure_open()
                self._cache.touch(segment)
            return segment.whole_records(transaction_id, count)

    def is_empty(self) -> bool:
        """Never held a record: one segment, starting at 0, with nothing in it."""
        with self._lock:
            self._check_open()
            return len(self._segments) == 1 and self._current.max_transaction_id == -1

    def start_at(self, transaction_id: int) -> None:
        """Make an empty partition's log begin at ``transaction_id`` (a replica filled after
        retention removed the head everywhere else). The caller checks retention allows it.

        The empty segment 0 goes first: a crash before the new one exists leaves no segment, and
        :meth:`open` recreates segment 0, i.e. the state before this call.
        """
        with self._lock:
            self._check_open()
            if not (len(self._segments) == 1 and self._current.max_transaction_id == -1):
                raise StorageError(f"partition {self.partition_id} is not empty: cannot start it later")
            if transaction_id <= 0:
                raise StorageError(f"transaction id out of range: {transaction_id}")
            empty = self._segments.pop()
            empty.delete()
            self._disk.fsync_directory(self.directory)
            self._segments.append(self._new_segment(transaction_id))
            log.info("partition %d: log starts at transaction %d", self.partition_id, transaction_id)
