"""Appends whose sync is the disk pass's: written now, made durable by one sync for the pass.

A storage node's disk pass of several partitions may make all their appends durable with one
whole-disk sync (``Disk.sync_all``: ``syncfs``) instead of one ``fdatasync`` each
(waltz_engine/storage/syncfs.py says where that is safe). Durability and visibility stay as with
a file's own sync:

* :meth:`HeldAppends.append_held` writes a partition's records with the data's last sync left
  out and returns with the partition's lock still held: no request, read, scrub or metric of
  that partition sees the records before :meth:`PassSyncs.finish` synced them (or cut them).
  Only the pass's thread holds several partitions' locks (one per partition, taken in its
  order); nothing else takes two, and nothing under a partition's lock waits for that thread.
* :meth:`PassSyncs.finish` syncs (one file alone: its ``fdatasync``; several: the whole disk),
  then releases each partition. A failed sync fails every partition it covered: each is cut
  back to where it was (as a failed write or ``fdatasync`` cuts it) and its requests answered
  with the error; a failed write failed only its own partition, at once.

Anything else (a roll-over, a refill, a closed partition) is not held: the caller appends as
always, with the files' own syncs.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

from waltz_engine.disk.record_run import AppendRun, WireRecordRun
from waltz_engine.storage.file_system import WholeSync
from waltz_engine.storage.partition_head import PartitionHead
from waltz_engine.storage.refill import RefillCopy
from waltz_engine.storage.segment import Segment

log = logging.getLogger(__name__)

# (first txid, max txid) of a partition.
Span = tuple[int, int]
# Told once the held append is durable (None) or was cut back (the error), with the span then.
Settled = Callable[[OSError | None, Span], None]


class HeldAppend:
    """One partition's append, written, not yet synced; the partition's lock held."""

    def __init__(self, lock: threading.Lock, segment: Segment, start: int, mark: tuple[int, int]) -> None:
        self._lock = lock
        self._segment = segment
        self._start = start
        # Where the segment ended before (next txid, next offset): where a failure cuts it.
        self._mark = mark
        self.span: Span = (start, segment.max_transaction_id)

    def sync(self) -> None:
        """The append's own sync (a pass with no other partition held)."""
        self._segment.sync_data()

    def release(self, error: OSError | None) -> Span:
        """After the sync that covers it, or its failure (``error``: cut back first); the span now."""
        try:
            if error is not None:
                self.span = (self._start, self._mark[0] - 1)
                self._segment.cut_back(*self._mark)
        except OSError as e:
            # The segment's end is set back all the same; the next append overwrites what is past it.
            log.warning("%s: cutting back a failed append failed: %s", self._segment.seg_path, e)
        finally:
            self._lock.release()
        return self.span


class HeldAppends(PartitionHead):
    """A storage node's lone appends for :class:`waltz_engine.storage.partition.Partition` (kept
    apart for size): :meth:`append_next`, :meth:`append_record`, :meth:`append_held`."""

    _closed: bool
    _refill: RefillCopy | None
    _threshold_bytes: int

    def _start(self) -> int:
        raise NotImplementedError

    def _append_run(self, run: AppendRun) -> None:
        raise NotImplementedError

    def append_next(self, run: WireRecordRun) -> tuple[int, int] | None:
        """The storage node's lone append: :meth:`append` of records from the next txid with
        nothing in the way, then the new :meth:`span`, under one lock. None: nothing done (closed,
        a refill, a foreign segment, not consecutive): :meth:`append` meets it."""
        txids = run.txids
        if len(txids) == 1 and (span := self.append_record(txids[0], run.disk_record())) is not None:
            return span
        with self._lock:
            current = (segments := self._segments)[-1]  # (the current segment, no property call)
            if (
                self._closed
                or self._refill is not None
                or current.foreign is not None
                or not txids
                or not run.consecutive_from(current.next_transaction_id)
            ):
                return None
            self._append_run(run)  # (a run of several, or one that rolls the segment over)
            return self._start(), segments[-1].max_transaction_id

    def append_record(self, txid: int, data: bytes) -> tuple[int, int] | None:
        """:meth:`append_next` of one record (``data``: its disk bytes, ``disk_record``) at the next
        txid, the current segment under its threshold (``_append_run``'s one turn, without a
        roll-over): a lone appender's every request. None: nothing done (closed, a refill, a
        foreign segment, not the next txid, a segment to roll over first)."""
        with self._lock:
            current = self._segments[-1]  # (the current segment, no property call)
            if (
                self._closed
                or self._refill is not None
                or current.foreign is not None
                or txid != current.next_transaction_id
                or current.size_bytes > self._threshold_bytes
            ):
                return None
            current.append_record(txid, data)
            return self._start(), current.max_transaction_id

    def append_held(self, run: AppendRun) -> HeldAppend | None:
        """``run``, beginning at the next txid, written to the current segment without its last
        sync, the partition's lock kept until :meth:`HeldAppend.release`. None: nothing done (the
        partition is closed or refilling, the segment foreign, the run not next or not within the
        segment): :meth:`Partition.append` meets it. A failed write raises, cut back, unlocked."""
        lock = self._lock
        lock.acquire()
        try:
            current = self._current
            room_bytes = self._threshold_bytes - current.size_bytes
            if (
                self._closed
                or self._refill is not None
                or current.foreign is not None
                or len(run) == 0
                or room_bytes < 0
                or not run.consecutive_from(current.next_transaction_id)
                or run.end_within(0, room_bytes) < len(run)
            ):
                lock.release()
                return None
            mark = current.next_transaction_id, current.size_bytes
            current.append(run, 0, sync=False)
            return HeldAppend(lock, current, self._start(), mark)
        except BaseException:
            lock.release()
            raise


class SharedSync:
    """A node's whole-disk sync, shared by its passes: one at a time, and a pass whose appends
    another pass's failed sync may have covered fails too.

    The kernel reports a failed writeback to one ``syncfs`` caller of the descriptor: when pass A
    syncs the disk, A's sync writes back what pass B wrote before it too; if that fails, A gets
    the error and B's own sync then returns 0. So the syncs go one at a time, each failure is
    counted, and a pass that wrote before a failure counted (:meth:`mark` at its start) fails
    as if its own sync had."""

    def __init__(self, whole: WholeSync) -> None:
        self._whole = whole
        self._lock = threading.Lock()
        self._failures = 0

    def mark(self) -> int:
        """Before a pass writes: what :meth:`sync` checks against."""
        return self._failures

    def sync(self, mark: int) -> None:
        """Everything written since :meth:`mark` returned ``mark`` is durable, or an OSError."""
        with self._lock:
            try:
                self._whole.sync()
            except OSError:
                self._failures += 1
                raise
            if self._failures != mark:
                raise OSError(
                    errno.EIO, "an earlier whole-disk sync failed after this pass's appends were written"
                )

    def close(self) -> None:
        with self._lock:
            self._whole.close()


class PassSyncs:
    """The held appends of one disk pass, made durable together by :meth:`finish`."""

    def __init__(self, sync_all: Callable[[], None]) -> None:
        self._sync_all = sync_all
        self._held: list[tuple[HeldAppend, Settled]] = []

    def hold(self, held: HeldAppend, settled: Settled) -> None:
        self._held.append((held, settled))

    def finish(self) -> None:
        """Sync what is held (one file: its own sync; more: the whole disk), release every
        partition (cut back when the sync failed), then tell each ``settled``."""
        held, self._held = self._held, []
        if not held:
            return
        error: OSError | None = None
        try:
            if len(held) == 1:
                held[0][0].sync()
            else:
                self._sync_all()
        except OSError as e:
            error = e
        except BaseException:
            self._held = held
            self.abandon()
            raise
        spans = [append.release(error) for append, _ in held]
        for (_, settled), span in zip(held, spans, strict=True):
            settled(error, span)

    def abandon(self) -> None:
        """The pass died (a bug, or the simulator's machine in a write): release the partitions,
        their appends cut back, with no sync and no answer."""
        held, self._held = self._held, []
        for append, _ in held:
            append.release(OSError("the disk pass ended before its sync"))
