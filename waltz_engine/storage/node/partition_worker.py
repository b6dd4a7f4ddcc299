"""One partition's request processing: a bounded queue, session fencing and the flag checks;
its disk work runs in the node's disk passes (disk_passes.py), one batch at a time (the
original's "Storage-P<id>" task, reference §1.2).

The connection handlers decode a request once and :meth:`PartitionWorker.submit` it; when
the queue is full they wait, and so stop reading their socket (back pressure). A worker with
requests queued and no batch on disk is ready for the next pass, which takes its whole queue
(up to its capacity). No task sits between the handler and the disk: a request waiting alone
costs no extra event loop turn. No fsync runs on the event loop. Consecutive APPENDs that
would each succeed alone are written with one fsync (group commit); each SUCCESS is sent only
after its records are durable, encoded off the loop, written on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from waltz_engine.common.clock import monotonic_s
from waltz_engine.common.errors import StorageError
from waltz_engine.common.limited_log import LimitedLog
from waltz_engine.common.metrics import Counter, Meter, MetricsRegistry, Timer
from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.disk.record_run import JoinedRuns
from waltz_engine.net.channel import FramedConnection
from waltz_engine.storage.control_file import ConcurrentUpdateError
from waltz_engine.storage.damage import DAMAGE_GAUGE
from waltz_engine.storage.held_append import PassSyncs
from waltz_engine.storage.node.disk_passes import DiskPasses, Reply
from waltz_engine.storage.node.failures import PartitionNotAssignedError, describe_os_error, failure_frame
from waltz_engine.storage.node.held_batch import append_held, lone_append_partition
from waltz_engine.storage.node.session_bounds import NO_SESSION, SessionBounds
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.tier.reads import USAGE_GAUGE, disk_usage
from waltz_engine.wire.primitives import SessionInfo
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    STORAGE_RAW_RECORDS_CODEC,
    StorageAppendRunRequest,
    StorageLastSessionInfoRequest,
    StorageLastSessionInfoResponse,
    StorageMaxTransactionIdRequest,
    StorageMaxTransactionIdResponse,
    StorageRecordHeaderListRequest,
    StorageRecordHeaderListResponse,
    StorageRecordHeaderRequest,
    StorageRecordHeaderResponse,
    StorageRecordListRawResponse,
    StorageRecordListRequest,
    StorageRecordRequest,
    StorageRecordResponse,
    StorageSetLowWaterMarkRequest,
    StorageSuccessResponse,
    StorageTruncateRequest,
    request_name,
    success_frame,
)

log = logging.getLogger(__name__)
# A forged session id is anyone's to send: its warnings are limited.
_refusals = LimitedLog(log)
_disk_errors = LimitedLog(log)

# The original's ArrayBlockingQueue(100) per partition.
PARTITION_QUEUE_CAPACITY = 100
# Requests taken from the queue for one pass.
MAX_BATCH_REQUESTS = PARTITION_QUEUE_CAPACITY
METRIC_GROUP_PREFIX = "waltz-storage.partition-"

# Requests that carry usedByOfflineRecovery; the others are always normal requests.
_OFFLINE_CAPABLE = (
    StorageLastSessionInfoRequest,
    StorageSetLowWaterMarkRequest,
    StorageTruncateRequest,
    StorageAppendRunRequest,
    StorageMaxTransactionIdRequest,
)
PARTITION_REQUEST_TYPES = (
    *_OFFLINE_CAPABLE,
    StorageRecordHeaderRequest,
    StorageRecordRequest,
    StorageRecordHeaderListRequest,
    StorageRecordListRequest,
)

# The requests that may move the node's fencing session id: the one that opens a session on a
# replica (a recovery's first request) and the writes. A read never moves it, so a read with an
# id the node has not seen is refused rather than fencing the real session out.
# The metrics gauge listing a partition's oldest local segments, [first, max] each, at most this
# many (about 4 KiB of JSON per partition on every metrics request).
SEGMENT_SPANS_GAUGE = "head-segment-spans"
SEGMENT_SPANS_REPORTED = 128

SESSION_MOVING_REQUESTS = (
    StorageLastSessionInfoRequest,
    StorageAppendRunRequest,
    StorageTruncateRequest,
    StorageSetLowWaterMarkRequest,
)

Pending = tuple[FramedConnection, Any]


class RefusedRequest(NamedTuple):
    """A request refused on receipt; queued so that its FAILURE keeps the connection's order."""

    request: Any
    error: StorageError


def metric_group(partition_id: int) -> str:
    return f"{METRIC_GROUP_PREFIX}{partition_id}"


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


class _PartitionMetrics:
    """The original's per-partition metrics (reference §1.8); registered while assigned."""

    def __init__(self, registry: MetricsRegistry, worker: PartitionWorker) -> None:
        group = metric_group(worker.partition_id)
        self.group = group
        self.append: Meter = registry.meter(group, "append")
        self.append_latency: Timer = registry.timer(group, "append-latency")

        def info_field(read: Callable[[Any], int]) -> Callable[[], int | None]:
            def gauge() -> int | None:
                partition = worker.partition
                return None if partition is None else read(partition.info.current)

            return gauge

        registry.gauge(group, "session-id", info_field(lambda s: s.session_id))
        registry.gauge(group, "process-queue-size", worker.queue_size)
        registry.gauge(group, "low-water-mark", info_field(lambda s: s.low_water_mark))
        registry.gauge(group, "local-low-water-mark", info_field(lambda s: s.local_low_water_mark))
        registry.gauge(group, "flags", info_field(lambda s: s.flags))
        registry.gauge(group, "sequence-number", info_field(lambda s: s.sequence_number))
        # Cached by the disk thread: reading the partition would wait for an fsync in progress.
        registry.gauge(group, "max-transaction-id", lambda: worker.max_transaction_id)
        # Retention (our extension): the retained start, and how many segments the cleaner removed.
        registry.gauge(group, "first-transaction-id", lambda: worker.first_transaction_id)
        # Damaged segments (issue 13): kept on disk and refused on reads until refilled.
        registry.gauge(group, DAMAGE_GAUGE, lambda: worker.partition and worker.partition.damage_json())
        self.removed_segments: Counter = registry.counter(group, "removed-segments")
        # An empty replica begun at the retained start (``_start_late``): its head never held here.
        self.late_starts: Counter = registry.counter(group, "late-starts")
        # The oldest local segments' spans (our extension, read by the dry runs; a Java node has none).
        registry.gauge(
            group,
            SEGMENT_SPANS_GAUGE,
            lambda: worker.partition and worker.partition.head_segment_spans(SEGMENT_SPANS_REPORTED),
        )
        # Tiered storage (issue 25): local and tier bytes and segments.
        registry.gauge(group, USAGE_GAUGE, lambda: worker.partition and disk_usage(worker.partition))
        self.counters: dict[type[Any], Counter] = {
            StorageLastSessionInfoRequest: registry.counter(group, "last-session-info-request"),
            StorageSetLowWaterMarkRequest: registry.counter(group, "set-low-water-mark-request"),
            StorageTruncateRequest: registry.counter(group, "truncate-request"),
            StorageRecordHeaderRequest: registry.counter(group, "record-header-request"),
            StorageRecordRequest: registry.counter(group, "record-request"),
            StorageMaxTransactionIdRequest: registry.counter(group, "max-transaction-request"),
            StorageRecordHeaderListRequest: registry.counter(group, "record-header-list-request"),
            StorageRecordListRequest: registry.counter(group, "record-list-request"),
        }


class PartitionWorker:
    """Lives as long as the node; serves whichever :class:`Partition` object is attached."""

    def __init__(
        self, partition_id: int, registry: MetricsRegistry, session_bounds: SessionBounds, passes: DiskPasses
    ) -> None:
        self.partition_id = partition_id
        self._passes = passes
        self._session_bounds = session_bounds
        self.partition: Partition | None = None
        # The fencing session id: raised on receipt, checked when processed (reference §1.2).
        self.session_id = NO_SESSION
        self.max_transaction_id = -1
        self.first_transaction_id = 0
        # The last txid the cleaner's last removal took (-1: none yet). The retained start may lie
        # above it without retention: a log emptied and begun again at the others' retained start.
        self.retention_removed_through = -1
        # The last write's disk error (a full disk, EIO), until a write succeeds: for /health.
        self.write_error: str | None = None
        # The effective retention bound the node's cleaner last read (None: none, or unknown).
        self.retention_bound: int | None = None
        # How late an empty replica may begin its log (``_start_late``): the highest retention
        # bound ever set, as the cleaner last read it (None: none, or unknown).
        self.late_start_bound: int | None = None
        # Requests not yet handed to a pass (PARTITION_QUEUE_CAPACITY at most), and the
        # submitters waiting for room; both touched on the event loop only.
        self._queued: list[Pending] = []
        self._room_waiters: list[asyncio.Future[None]] = []
        # A batch of this partition is in a pass (one at a time keeps the partition's order).
        self._busy = False
        self._registry = registry
        self._metrics: _PartitionMetrics | None = None
        # Unassigned while this node ran: its session id was reset (``_fence_forgotten``).
        self._reset = False
        # A request that may move the session id, queued once ZooKeeper confirmed (or refused) it.
        self._pending_check: asyncio.Task[None] | None = None

    # --- lifecycle (event loop thread) ---------------------------------------------------------

    def attach(self, partition: Partition, max_transaction_id: int) -> None:
        """Serve ``partition`` (just assigned or opened at start)."""
        assert partition.partition_id == self.partition_id
        self.partition = partition
        self.session_id = partition.info.current.session_id
        self.max_transaction_id = max_transaction_id
        self.first_transaction_id = partition.first_transaction_id()
        self._metrics = _PartitionMetrics(self._registry, self)

    def detach(self) -> None:
        """The partition was unassigned: queued requests fail, metrics go away."""
        self.partition = None
        self._reset = True
        if self._metrics is not None:
            self._registry.remove_group(self._metrics.group)
            self._metrics = None

    async def stop(self) -> None:
        """Stop checking sessions; the node's :meth:`DiskPasses.stop` completes the batch in hand."""
        pending, self._pending_check = self._pending_check, None
        await cancel_and_wait(pending)

    def queue_size(self) -> int:
        """Requests waiting for a pass (the batch on disk not counted)."""
        return len(self._queued)

    def submit_now(self, conn: FramedConnection, msg: Any) -> bool:
        """:meth:`submit` when it needs no waiting (no session check pending or due, room in the
        queue), in the caller's call; False: nothing was done, use :meth:`submit`."""
        if self.needs_check(msg) or len(self._queued) >= PARTITION_QUEUE_CAPACITY:
            return False
        with self._passes.lock:
            self._queued.append((conn, msg))
            if not self._busy:
                self._passes.ready(self)
        return True

    def needs_check(self, msg: Any) -> bool:
        """``msg`` must wait for a session check (pending, or one it starts): :meth:`submit`'s
        work, on the loop."""
        return self.waits_for_check(msg.session_id, type(msg) in SESSION_MOVING_REQUESTS)

    def waits_for_check(self, session_id: int, moving: bool = True) -> bool:
        """:meth:`needs_check` of a request of ``session_id`` (``moving``: one that may move the
        fencing session id, an APPEND among them)."""
        pending = self._pending_check
        return (pending is not None and not pending.done()) or (moving and session_id > self.session_id)

    def claim_off_loop(self, count: int) -> bool:
        """Under the passes' lock, off the loop: True when nothing is queued or on disk (so this
        partition is in no pass and waits for none), and the worker is now busy with a batch of
        ``count`` requests the caller runs (:meth:`DiskPasses.run_claimed`)."""
        if self._busy or self._queued or count > MAX_BATCH_REQUESTS or self.partition is None:
            return False
        self._busy = True
        return True

    def unclaim(self) -> None:
        """Under the passes' lock: undo :meth:`claim_off_loop` (the passes are stopping)."""
        assert self._busy and not self._queued
        self._busy = False

    def queue_off_loop(self, pending: list[Pending]) -> tuple[int, bool]:
        """Under the passes' lock, off the loop: queue what fits behind what waits; the count
        queued, and whether the worker is ready (none of its batches on disk: the caller tells
        the passes, as :meth:`submit_now` does)."""
        room = PARTITION_QUEUE_CAPACITY - len(self._queued)
        if room <= 0:
            return 0, False
        self._queued += pending[:room]
        return min(room, len(pending)), not self._busy

    async def queue_in_order(self, pending: list[Pending]) -> None:
        """On the loop: queue each, waiting for room as :meth:`submit` does (back pressure)."""
        for one in pending:
            await self._put(one)

    async def submit(self, conn: FramedConnection, msg: Any) -> None:
        """Queue a request; waits while the queue is full, which stops the caller's reads.

        A request that may write moves the fencing session id on receipt (as the original),
        but only to an id ZooKeeper has issued for the partition.
        """
        pending = self._pending_check
        if pending is not None and not pending.done():
            # This partition's requests keep their order behind the check. Rare: a server waits
            # for LAST_SESSION_INFO's answer before it sends more for the partition.
            await pending
        if msg.session_id > self.session_id and type(msg) in SESSION_MOVING_REQUESTS:
            # Checked off the connection's read loop: other partitions' requests on the same
            # connection go on while ZooKeeper answers (or times out).
            self._pending_check = asyncio.create_task(
                self._check_then_queue(conn, msg), name=f"session-check-{self.partition_id}"
            )
            return
        await self._put((conn, msg))

    async def _check_then_queue(self, conn: FramedConnection, msg: Any) -> None:
        try:
            await self._session_bounds.check(
                self.partition_id, msg.session_id, latest_only=self._fence_forgotten()
            )
        except StorageError as e:
            queued: Any = RefusedRequest(msg, e)
        else:
            self.session_id = max(self.session_id, msg.session_id)
            queued = msg
        await self._put((conn, queued))

    def _fence_forgotten(self) -> bool:
        """The session id is unset, yet the replica is not new: it was unassigned while this node
        ran (which resets the session id, as the original), or it holds records or a low-water mark
        no store session set (files kept from an earlier time as a replica, a move's copy). A
        session older than ZooKeeper's latest may then be a deposed writer's, which this replica
        would no longer refuse (issue 32: the simulator's seed 1156): see ``session_bounds``."""
        if self.session_id != NO_SESSION:
            return False
        partition = self.partition
        return (
            self._reset
            or self.max_transaction_id >= 0
            or (partition is not None and partition.info.current.low_water_mark >= 0)
        )

    async def _put(self, pending: Pending) -> None:
        lock = self._passes.lock
        while True:
            # Under the lock: a pass's thread that takes the queue sees this waiter, or this
            # sees the room it made.
            with lock:
                if len(self._queued) < PARTITION_QUEUE_CAPACITY:
                    self._queued.append(pending)
                    if not self._busy:
                        self._passes.ready(self)
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._room_waiters.append(waiter)
            try:
                await waiter
            finally:
                with lock:
                    if waiter in self._room_waiters:
                        self._room_waiters.remove(waiter)

    def take_batch(self, on_loop: bool) -> list[Pending]:
        """For a pass, under the passes' lock, on the loop or on the thread of the pass before:
        what is queued (MAX_BATCH_REQUESTS at most); room for the waiters."""
        batch = self._queued[:MAX_BATCH_REQUESTS]
        del self._queued[:MAX_BATCH_REQUESTS]
        self._busy = True
        waiters, self._room_waiters = self._room_waiters, []
        if waiters:
            if on_loop:
                _wake(waiters)
            else:
                waiters[0].get_loop().call_soon_threadsafe(_wake, waiters)
        return batch

    def batch_done(self) -> bool:
        """Under the passes' lock: the pass answered this partition's batch; True when requests
        wait for the next one."""
        self._busy = False
        return bool(self._queued)

    # --- processing (off the event loop, in a pass) -----------------------------------------

    def process_batch(self, batch: list[Pending], syncs: PassSyncs | None = None) -> list[Reply]:
        """``syncs``: a pass that syncs its partitions together may hold a lone append's sync."""
        if len(batch) == 1:
            conn, msg = batch[0]
            if type(msg) is StorageAppendRunRequest:
                if syncs is not None and (held := append_held(self, conn, msg, syncs)) is not None:
                    return held
                frame = self.append_alone(msg)
                if frame is not None:
                    return [(conn, frame)]
        replies: list[Reply] = []
        i = 0
        while i < len(batch):
            kind = type(batch[i][1])
            if kind is StorageAppendRunRequest:
                i = self._append_group(batch, i, replies)
            elif kind is RefusedRequest:
                conn, refused = batch[i]
                where = f"partition {self.partition_id}"
                _refusals.warn(where, f"{where}: {refused.error}")
                replies.append((conn, failure_frame(refused.request, refused.error)))
                i += 1
            else:
                conn, msg = batch[i]
                replies.append((conn, self._process_one(msg)))
                i += 1
        partition = self.partition
        if partition is not None:
            with contextlib.suppress(StorageError):
                self.first_transaction_id, self.max_transaction_id = partition.span()
        return replies

    def removed_segments(self, count: int, first_transaction_id: int) -> None:
        """The cleaner removed ``count`` head segments; the log now starts at ``first_transaction_id``."""
        self.first_transaction_id = first_transaction_id
        self.retention_removed_through = first_transaction_id - 1
        if self._metrics is not None:
            self._metrics.removed_segments.inc(count)

    def _start_late(self, partition: Partition, msg: StorageAppendRunRequest) -> None:
        """Let an empty replica begin at the first appended txid when retention removed everything
        before it (a replica added after retention). Only a partition that never held a record,
        and only up to the highest retention bound ever set, so a gap can appear only where the
        operator once allowed records to go (a bound lowered since brings nothing back)."""
        txids = msg.records.txids
        first = txids[0] if txids else 0
        if first <= 0 or not partition.is_empty():
            return
        bound = self.late_start_bound
        if bound is None or first > bound:
            raise StorageError(
                f"partition {self.partition_id} is empty: cannot start at transaction {first} above "
                f"the highest retention bound ever set ({'none' if bound is None else bound})"
            )
        partition.start_at(first)
        if self._metrics is not None:
            self._metrics.late_starts.inc()
        log.info("partition %d: empty, begins its log at the retained start %d", self.partition_id, first)

    def _check_permissions(self, partition: Partition | None, msg: Any) -> Partition:
        """The original's ``checkPermissions``; returns the partition to work on."""
        if partition is None:
            raise PartitionNotAssignedError(self.partition_id)
        info = partition.info.current
        if not info.assigned:
            raise StorageError(f"partition {self.partition_id} is not assigned to storage node.")
        if type(msg) in _OFFLINE_CAPABLE and msg.used_by_offline_recovery:
            if info.available:
                raise StorageError("cannot run offline recovery while partition is online")
            if msg.session_id != info.session_id:
                raise StorageError(
                    f"partition last session id has changed to {info.session_id}, but request context "
                    f"contains {msg.session_id}"
                )
        else:
            if not info.available:
                raise StorageError(
                    f"read and write for partition={self.partition_id} have been disabled on storage node"
                )
            if msg.session_id < self.session_id:
                raise ConcurrentUpdateError(
                    f"session id has changed to {self.session_id}, but request context contains "
                    f"{msg.session_id}"
                )
            if msg.session_id > self.session_id:
                raise ConcurrentUpdateError(
                    f"session id {msg.session_id} has not been opened on this replica (its session id "
                    f"is {self.session_id}): a read does not move it"
                )
        return partition

    def _append_group(self, batch: list[Pending], start: int, replies: list[Reply]) -> int:
        """Append the run of consecutive APPENDs from ``start`` that would each succeed alone, with
        one fsync; return the index after the run. A request that would fail stops the run and is
        then processed alone, so the outcome of every request is the same as one by one."""
        first = batch[start][1]
        try:
            partition = self._check_permissions(self.partition, first)
            expected = partition.max_transaction_id() + 1
            txids = first.records.txids
            if txids and txids[0] != expected:
                # Only an empty replica can begin late, and its next txid is 0: an append at
                # the next txid needs no look (a lock) at the partition.
                self._start_late(partition, first)
                expected = partition.max_transaction_id() + 1
            alone = not first.records.consecutive_from(expected)
        except Exception:
            alone = True
        if alone:
            # It fails (or is refilled) on its own, with the error it would meet alone.
            conn, msg = batch[start]
            replies.append((conn, self._process_one(msg)))
            return start + 1
        group: list[Pending] = [batch[start]]
        expected += len(first.records)
        end = start + 1
        while end < len(batch) and type(batch[end][1]) is StorageAppendRunRequest:
            msg = batch[end][1]
            try:
                self._check_permissions(partition, msg)
            except Exception:
                break
            if not msg.records.consecutive_from(expected):
                break
            group.append(batch[end])
            expected += len(msg.records)
            end += 1
        started_s = monotonic_s()
        try:
            if len(group) == 1:
                partition.append(first.records)
            else:
                partition.append(JoinedRuns([msg.records for _, msg in group]))
        except Exception as e:
            self._log_failure(group[0][1], e)
            replies += [(conn, failure_frame(msg, e)) for conn, msg in group]
            return end
        self.appended(started_s, len(group))
        for conn, msg in group:
            replies.append((conn, success_frame(msg.session_id, msg.seq_num, msg.partition_id)))
        return end

    def append_alone(self, msg: StorageAppendRunRequest) -> bytes | None:
        """A lone APPEND of the session at the next txid on an online replica, checked in a few
        comparisons, appended under one lock; its answer, or None (nothing done: the general path)."""
        partition = lone_append_partition(self, msg)
        if partition is None:
            return None
        started_s = monotonic_s()
        try:
            span = partition.append_next(msg.records)
        except Exception as e:
            return self._append_failed(partition, msg, e)
        if span is None:
            return None
        self.first_transaction_id, self.max_transaction_id = span
        self.appended(started_s)
        return success_frame(msg.session_id, msg.seq_num, msg.partition_id)

    def appended(self, started_s: float, count: int = 1) -> None:
        """``count`` APPENDs begun at ``started_s`` are durable: the write error cleared, the meter
        and the latency timer given one clock read for all (every path of a successful append)."""
        self.write_error = None
        metrics = self._metrics
        if metrics is not None:
            now_s = monotonic_s()
            metrics.append.mark_at(now_s, count)
            metrics.append_latency.update_at(now_s, (now_s - started_s) * 1000.0, count)

    def _append_failed(self, partition: Partition, msg: StorageAppendRunRequest, error: Exception) -> bytes:
        """A lone append that failed (cut back): logged, the span read again, its FAILURE."""
        self._log_failure(msg, error)
        with contextlib.suppress(StorageError):
            self.first_transaction_id, self.max_transaction_id = partition.span()
        return failure_frame(msg, error)

    def _process_one(self, msg: Any) -> bytes:
        try:
            partition = self._check_permissions(self.partition, msg)
            metrics = self._metrics
            if metrics is not None:
                counter = metrics.counters.get(type(msg))
                if counter is not None:
                    counter.inc()
            reply = self._serve(partition, msg)
            if type(reply) is StorageRecordListRawResponse:
                return STORAGE_RAW_RECORDS_CODEC.encode_frame(reply)
            return STORAGE_CODEC.encode_frame(reply)
        except Exception as e:
            self._log_failure(msg, e)
            return failure_frame(msg, e)

    def _serve(self, partition: Partition, msg: Any) -> Any:
        session_id, seq_num, partition_id = msg.session_id, msg.seq_num, msg.partition_id
        kind = type(msg)
        if kind is StorageRecordRequest:
            return StorageRecordResponse(
                session_id, seq_num, partition_id, partition.record(msg.transaction_id)
            )
        if kind is StorageRecordListRequest:
            # The server's catch-up: served from the segments' bytes, as on the admin port.
            records = partition.records_wire(msg.transaction_id, msg.max_num_records).payload()
            return StorageRecordListRawResponse(session_id, seq_num, partition_id, records)
        if kind is StorageRecordHeaderRequest:
            header = partition.record_header(msg.transaction_id)
            return StorageRecordHeaderResponse(session_id, seq_num, partition_id, header)
        if kind is StorageRecordHeaderListRequest:
            headers = partition.record_headers(msg.transaction_id, msg.max_num_records)
            return StorageRecordHeaderListResponse(session_id, seq_num, partition_id, tuple(headers))
        if kind is StorageMaxTransactionIdRequest:
            return StorageMaxTransactionIdResponse(
                session_id, seq_num, partition_id, partition.max_transaction_id()
            )
        if kind is StorageLastSessionInfoRequest:
            info = SessionInfo(*partition.last_session_info())
            return StorageLastSessionInfoResponse(session_id, seq_num, partition_id, info)
        if kind is StorageSetLowWaterMarkRequest:
            partition.set_low_water_mark(session_id, msg.low_water_mark)
            return StorageSuccessResponse(session_id, seq_num, partition_id)
        if kind is StorageTruncateRequest:
            # The original replies min(max txid, t): truncate returns exactly that.
            new_max = partition.truncate(msg.transaction_id)
            self.first_transaction_id = partition.first_transaction_id()  # (-1 empties a headless log)
            return StorageMaxTransactionIdResponse(session_id, seq_num, partition_id, new_max)
        if kind is StorageAppendRunRequest:
            txids = msg.records.txids
            held = txids and txids[0] <= partition.max_transaction_id()
            if msg.used_by_offline_recovery and held:
                # Records it holds: a damaged segment refilled from a healthy replica.
                partition.refill(msg.records.records())
                return StorageSuccessResponse(session_id, seq_num, partition_id)
            # Reached only for an append that cannot join a group: it fails alone here.
            self._start_late(partition, msg)
            partition.append(msg.records)
            self.write_error = None
            return StorageSuccessResponse(session_id, seq_num, partition_id)
        raise StorageError(f"unknown message type: {kind.__name__}")

    def _log_failure(self, msg: Any, error: BaseException) -> None:
        if isinstance(error, StorageError):
            log.info("partition %d: %s failed: %s", self.partition_id, request_name(msg), error)
        elif isinstance(error, OSError):
            # A full or failing disk fails every batch the same way: one line now and then, and a
            # state that /health reports until a write succeeds again.
            partition = self.partition
            under = f" under {partition.directory}" if partition is not None else ""
            self.write_error = describe_os_error(error) + under
            where = f"partition {self.partition_id}"
            _disk_errors.warn(
                where,
                f"{where}: {request_name(msg)} failed: {self.write_error}; writes to this partition fail "
                "until the disk is fixed (reads are served)",
            )
        elif isinstance(error, ObjectStoreError):
            # A read of a segment evicted to the tier, whose store failed it: the request fails
            # and its sender asks again or another replica; an operator needs the store's answer,
            # not a traceback (the simulator's searches printed one per refused get).
            log.warning("partition %d: %s failed: %s", self.partition_id, request_name(msg), error)
        else:
            log.error("partition %d: %s failed", self.partition_id, request_name(msg), exc_info=error)
