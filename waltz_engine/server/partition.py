"""One partition served by this server (reference §2.5, §2.6; the original's ``Partition``).

Three tasks per partition, as the original's three threads: the append task (a bounded queue of
appends, flushes and mounts, in arrival order) and the realtime and catch-up feed workers. Commits
arrive as callbacks on the store's append futures (in txid order), never as tasks: each one fills
the feed and transaction caches, commits the lock slots, raises the commit high-water mark and
wakes the feed workers.

Mounts and flushes never stall the append task: each waits (``append_barrier``) until the appends
queued before it are decided, while the appends behind it go on to the store; the mounts waiting
on the same appends are answered together.

A mount or flush is answered only from a store session that recovered at the partition's current
generation: when the assignment raises the generation (another server may have owned the partition
in between and committed more), the append task opens a new store session, whose recovery decides
the log, before it serves anything else; a MOUNT from a client that already knows a newer
generation than this server is answered NOT_READY (the client retries) instead of from what this
server knew before. Answers never go below the current session's recovered high-water mark. An
idle partition answers from what it knows: no storage or ZooKeeper round trip per mount.

A mount's catch-up is sent from the partition's shared encoded frames (``feed_frames``), in
batches, like every feed.

Connection validity (PR #167): a MOUNT registers its connection for the client id unless the
registered one is newer by (generation, network-client seqNum); APPEND, FEED and MOUNT from any
other connection of that client are ignored (a stale network client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from waltz_engine.common import clock
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.append_barrier import AppendBarrier
from waltz_engine.server.config import EngineSettings
from waltz_engine.server.feed_cache import FeedCache
from waltz_engine.server.feed_frames import FeedFrames
from waltz_engine.server.feeds import FeedClient, FeedContext, FeedWorker
from waltz_engine.server.locks import (
    NO_LOCK_HIGH_WATER_MARK,
    NO_LOCK_REQUEST,
    NUM_HASH_FUNCS,
    LockRequest,
    Locks,
    lock_request,
)
from waltz_engine.server.partition_data import PartitionData
from waltz_engine.server.store.errors import AppendOutcomeUnknownError, GenerationMismatchError
from waltz_engine.server.store.queued_appends import AppendDecision
from waltz_engine.server.store_partition_like import StorePartitionLike
from waltz_engine.server.transaction_cache import TransactionFetcher
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_CLIENT_AHEAD,
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    AppendRequest,
    FeedRequest,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    LockFailure,
    MountRequest,
    MountResponse,
)

log = logging.getLogger(__name__)

APPEND_QUEUE_SIZE = 100  # the original's ArrayBlockingQueue(100)
METRIC_GROUP_PREFIX = "waltz-server.partition-"
NO_HIGH_WATER_MARK = -1  # before the store partition opened, and of an empty partition
FAILED_TRANSACTION_ID = -1  # the store's outcome of an append that definitely failed


class _Registration(NamedTuple):
    client: FeedClient
    generation: int
    seq_num: int


# Kinds of work on the append queue.
_APPEND = 0
_FLUSH = 1
_MOUNT = 2
_FEED = 3
_HIGH_WATER_MARK = 4
_REOPEN = 5  # the generation moved: open a store session at the new one before serving on


def metric_group(partition_id: int) -> str:
    return f"{METRIC_GROUP_PREFIX}{partition_id}"


class Partition(PartitionData):
    """Owns one partition's append path, lock table and feeds; all on the event loop."""

    store: StorePartitionLike

    def __init__(
        self,
        partition_id: int,
        generation: int,
        store: StorePartitionLike,
        feed_cache: FeedCache,
        fetcher: TransactionFetcher,
        settings: EngineSettings,
        metrics: MetricsRegistry,
    ) -> None:
        self.partition_id = partition_id
        self.generation = generation
        self.store = store
        # The store's append without a future (``StorePartition.append_lone``); None: a store
        # without it, whose appends all go through the append task.
        self._append_lone: Callable[..., bool] | None = getattr(store, "append_lone", None)
        self.feed_cache = feed_cache
        self.fetcher = fetcher
        self.settings = settings
        self.commit_high_water_mark = NO_HIGH_WATER_MARK
        self.closed = False
        # Called once when one of the partition's tasks ends with an unexpected error: the
        # partition can no longer serve (its owner replaces it; see ServerCore).
        self.on_task_failure: Callable[[Partition], None] | None = None
        self.pending_appends = 0
        self._settled = asyncio.Event()  # no append future is unresolved
        self._settled.set()
        self._ready = asyncio.Event()  # the store partition is open and the lock table built
        # The generation the open store session recovered at; the append task reopens the store
        # before serving anything when the partition's generation has moved past it.
        self._store_generation: int | None = None
        self._append_idle = False
        self._feed_due = False  # commits decided since the realtime feed was last served
        self._decision_now_s: float | None = None  # the clock read of the batch being decided
        self._generation_raised = asyncio.Event()
        self._locks: Locks | None = None
        self._queue: asyncio.Queue[tuple[int, FeedClient | None, Any]] = asyncio.Queue(APPEND_QUEUE_SIZE)
        self._clients: dict[int, _Registration] = {}
        # Mounts and flushes waiting for the appends queued before them.
        self._barrier = AppendBarrier()
        # Drives the store while work waits on the barrier (a failed store session is only
        # replaced, and its appends decided, when someone asks the store).
        self._store_driver: asyncio.Task[None] | None = None
        self.feed_frames = FeedFrames(partition_id, feed_cache)
        self.realtime = FeedWorker(
            f"Feed-R-P{partition_id}",
            True,
            self,
            feed_cache,
            self.feed_frames,
            settings.realtime_threshold,
            self._route,
        )
        self.catch_up = FeedWorker(
            f"Feed-C-P{partition_id}",
            False,
            self,
            feed_cache,
            self.feed_frames,
            settings.realtime_threshold,
            self._route,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics = metrics
        group = metric_group(partition_id)
        self._transaction_meter = metrics.meter(group, "transaction")
        self._success_meter = metrics.meter(group, "successful-append")
        self._rejection_meter = metrics.meter(group, "rejected-append")
        self._latency_timer = metrics.timer(group, "response-latency")
        metrics.gauge(group, "pending-append", lambda: self.pending_appends)
        metrics.gauge(group, "is-closed", lambda: self.closed)
        metrics.gauge(group, "generation", lambda: self.generation)
        metrics.gauge(group, "append-queue-size", self._queue.qsize)
        metrics.gauge(group, "waiting-mounts-and-flushes", self.num_waiting_for_appends)
        metrics.gauge(group, "total-real-time-feed-context-added", lambda: self.realtime.total_added)
        metrics.gauge(group, "total-real-time-feed-context-removed", lambda: self.realtime.total_removed)
        metrics.gauge(group, "total-catchup-feed-context-added", lambda: self.catch_up.total_added)
        metrics.gauge(group, "total-catchup-feed-context-removed", lambda: self.catch_up.total_removed)
        metrics.gauge(group, "high-water-mark", lambda: self.commit_high_water_mark)

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        await self.store.set_generation(self.generation)
        loop = asyncio.get_running_loop()
        name = f"P{self.partition_id}"
        self._tasks = [
            loop.create_task(self._append_task(), name=f"Append-{name}"),
            loop.create_task(self.realtime.run(), name=self.realtime.name),
            loop.create_task(self.catch_up.run(), name=self.catch_up.name),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self.closed:
            return
        log.error("partition %d: %s died", self.partition_id, task.get_name(), exc_info=task.exception())
        on_failure, self.on_task_failure = self.on_task_failure, None
        if on_failure is not None:
            on_failure(self)

    async def set_generation(self, generation: int) -> None:
        """A newer assignment: nothing is served from the old store session any more; the append
        task opens one at ``generation`` (recovery decides what another owner committed)."""
        if generation > self.generation:
            self.generation = generation
            self._ready.clear()
            await self.store.set_generation(generation)
            self._generation_raised.set()
            with contextlib.suppress(asyncio.QueueFull):  # a full queue reaches the check soon
                self._queue.put_nowait((_REOPEN, None, None))

    async def close(self) -> None:
        """Stops the tasks; feeds in progress end (the clients remount wherever it went)."""
        if self.closed:
            return
        self.closed = True
        self._barrier.clear()
        tasks = self._tasks + ([self._store_driver] if self._store_driver is not None else [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.realtime.contexts.clear()
        self.catch_up.contexts.clear()
        self._clients.clear()
        self.metrics.remove_group(metric_group(self.partition_id))

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def healthy(self) -> bool:
        return self.store.healthy

    @property
    def high_water_mark(self) -> int:
        """The committed high-water mark feeds read up to (FeedSource)."""
        return self.commit_high_water_mark

    def record_headers(self, transaction_id: int, max_num: int) -> Any:
        return self.store.record_headers(transaction_id, max_num)

    def append_queue_size(self) -> int:
        return self._queue.qsize()

    def num_waiting_for_appends(self) -> int:
        """Mounts and flushes waiting until the appends queued before them are decided."""
        return self._barrier.num_waiting

    # --- clients ---------------------------------------------------------------------------

    def _register(self, client: FeedClient, client_id: int, generation: int, seq_num: int) -> None:
        current = self._clients.get(client_id)
        if current is None or (generation, seq_num) > (current.generation, current.seq_num):
            self._clients[client_id] = _Registration(client, generation, seq_num)

    def _is_valid(self, client: FeedClient, client_id: int) -> bool:
        registration = self._clients.get(client_id)
        return registration is not None and registration.client is client

    def registered_clients(self) -> list[FeedClient]:
        """The connections of the clients that mounted here (or asked to)."""
        return [registration.client for registration in self._clients.values()]

    def remove_client(self, client: FeedClient, client_id: int | None) -> None:
        """The connection closed; its feed contexts are dropped as the workers reach them."""
        if client_id is not None and self._is_valid(client, client_id):
            del self._clients[client_id]

    # --- requests (from the connection handler) ------------------------------------------

    async def mount(self, client: FeedClient, request: MountRequest) -> None:
        req_id = request.req_id
        self._register(client, req_id.client_id, req_id.generation, request.seq_num)
        if not self._is_valid(client, req_id.client_id):
            return
        if req_id.generation > self.generation:
            # The client saw an assignment this server has not applied yet: whatever this server
            # knows may predate another owner's commits. It retries after not_ready_retry_ms.
            client.send(MountResponse(req_id, PARTITION_STATE_NOT_READY))
            return
        await self._queue.put((_MOUNT, client, request))  # after the appends queued before it

    async def append(self, client: FeedClient, request: AppendRequest) -> None:
        if not self.append_now(client, request):
            self._transaction_meter.mark()
            await self._queue.put((_APPEND, client, request))

    def append_now(self, client: FeedClient, request: AppendRequest) -> bool:
        """An append handled in this call (sent to storage, refused, or dropped for an invalid
        client); False: nothing was done, it must be queued (see :meth:`_append_now`)."""
        registration = self._clients.get(request.req_id.client_id)
        if registration is None or registration.client is not client:  # (not _is_valid)
            self._transaction_meter.mark()
            return True
        return self._append_idle and self._queue.empty() and self._append_now(client, request)

    async def flush(self, client: FeedClient, request: FlushRequest) -> None:
        if request.req_id.generation > self.generation:
            # The append it asks about was built for an assignment this server has not applied:
            # another owner may have committed it after all this server knows, and an answer
            # below it would prove it absent (the client would run it again). FLUSH has no
            # NOT_READY: no answer; the client asks again once mounted where the generation is.
            return
        await self._queue.put((_FLUSH, client, request))

    async def feed(self, client: FeedClient, request: FeedRequest) -> None:
        if not self._is_valid(client, request.req_id.client_id):
            return
        if self.ready:
            self._start_feed(client, request)
        else:
            await self._queue.put((_FEED, client, request))

    async def high_water_mark_request(self, client: FeedClient, request: HighWaterMarkRequest) -> None:
        if self.ready:
            client.send(HighWaterMarkResponse(request.req_id, self.commit_high_water_mark))
        else:
            await self._queue.put((_HIGH_WATER_MARK, client, request))

    # --- the append task -----------------------------------------------------------------

    async def _open_store(self) -> None:
        """Open a store session at the current generation (recovery); then serve from it."""
        while True:
            generation = self.generation
            self._generation_raised.clear()
            try:
                await self.store.ensure_open()
            except GenerationMismatchError as e:
                # A newer owner holds it in ZooKeeper: serve nothing until our assignment moves.
                log.warning("partition %d: %s; waiting for the assignment", self.partition_id, e)
                await self._generation_raised.wait()
                continue
            # The previous sessions' appends are decided; their callbacks run before we go on.
            await self._settled.wait()
            if generation == self.generation:
                break
        # PR #150: the commit high-water mark starts at the store's, not at "unknown"; after another
        # owner, at what its commits brought.
        self.commit_high_water_mark = max(self.commit_high_water_mark, self.store.high_water_mark)
        if self._locks is None:
            self._locks = Locks(self.settings.lock_table_size, NUM_HASH_FUNCS, self.commit_high_water_mark)
        else:
            # Another owner may have committed under any lock: every lock is as new as the mark.
            self._locks.reset(self.commit_high_water_mark)
        self._store_generation = generation
        self._ready.set()
        self.realtime.wake()
        self.catch_up.wake()

    async def _append_task(self) -> None:
        await self._open_store()
        queue = self._queue
        while True:
            self._append_idle = True  # (while the queue is empty: appends may go direct)
            try:
                kind, client, message = await queue.get()
            finally:
                self._append_idle = False
            if self._store_generation != self.generation:
                await self._open_store()
            if kind == _REOPEN:
                continue
            assert client is not None
            try:
                if kind == _APPEND:
                    await self._append(client, message)
                elif kind == _FLUSH:
                    self._after_appends(partial(self._answer_flush, client, message))
                elif kind == _MOUNT:
                    self._after_appends(partial(self._start_mount_feed, client, message))
                elif kind == _FEED:
                    self._start_feed(client, message)
                else:
                    assert kind == _HIGH_WATER_MARK, kind
                    client.send(HighWaterMarkResponse(message.req_id, self.commit_high_water_mark))
            except WaltzError as e:
                # A refused append (generation mismatch, closed store session) is dropped silently
                # for the client, as the original: it learns the outcome from flush or feed.
                log.debug("partition %d: %s failed: %s", self.partition_id, type(message).__name__, e)

    def _after_appends(self, work: Callable[[], None]) -> None:
        """Runs ``work`` once every append queued so far is decided; the append task goes on."""
        if self._barrier.after_issued(work) or self._store_driver is not None:
            return
        self._store_driver = asyncio.get_running_loop().create_task(
            self._drive_store(), name=f"Store-driver-P{self.partition_id}"
        )

    async def _drive_store(self) -> None:
        try:
            while self._barrier.num_waiting and not self.closed:
                await self.store.flush()
                await asyncio.sleep(0)  # the appends' callbacks run before the next look
        except WaltzError as e:
            log.debug("partition %d: store flush for waiting mounts failed: %s", self.partition_id, e)
        except Exception:
            # The store layer broke: the append task meets it too and the partition is replaced.
            log.error("partition %d: store flush for waiting mounts failed", self.partition_id, exc_info=True)
        finally:
            self._store_driver = None

    def _decided_high_water_mark(self) -> int:
        """The commit high-water mark, once the appends a mount or flush waited for are decided:
        never below what the current store session's recovery resolved."""
        store = self.store
        # Nothing in flight: no commit callback can come after the store's mark.
        floor = store.high_water_mark if self.pending_appends == 0 else store.low_water_mark
        if floor > self.commit_high_water_mark:
            self.commit_high_water_mark = floor
            self.realtime.wake()
            self.catch_up.wake()
        return self.commit_high_water_mark

    def _answer_flush(self, client: FeedClient, request: FlushRequest) -> None:
        client.send(FlushResponse(request.req_id, self._decided_high_water_mark()))

    async def _flush_store(self) -> int:
        """The store's HWM once every append queued so far is resolved and its callback ran."""
        high_water_mark = await self.store.flush()
        await self._settled.wait()
        self.commit_high_water_mark = max(self.commit_high_water_mark, high_water_mark)
        return high_water_mark

    def _append_now(self, client: FeedClient, request: AppendRequest) -> bool:
        """:meth:`_append` from the handler's own call, when the append task is idle and nothing
        needs waiting (its locks free, the store session with room); False: nothing was done,
        and the request goes through the queue. Queued requests are never overtaken: this runs
        only while the queue is empty and the task is waiting on it. Its outcome comes back as a
        call of the decision itself (``StorePartition.append_lone``), not through a future."""
        locks = self._locks
        append_lone = self._append_lone
        if locks is None or append_lone is None or self._store_generation != self.generation:
            return False
        lock_req = lock_request(request)
        if not locks.begin(lock_req):
            return False
        now_s = clock.monotonic_s()
        # Without locks only a client high-water mark below "no lock" is refused.
        if (
            lock_req is not NO_LOCK_REQUEST or request.client_high_water_mark < NO_LOCK_HIGH_WATER_MARK
        ) and self._refused(client, request, locks, lock_req):
            self._transaction_meter.mark_at(now_s)
            return True
        data = request.data if request.data is not None else b""
        decided, number = self._decision(request, locks, lock_req, data, now_s)
        if not append_lone(request.req_id, request.header, data, request.checksum, decided):
            locks.end(lock_req)
            return False
        self._count_issued(number)
        self._transaction_meter.mark_at(now_s)
        return True

    def _refused(
        self, client: FeedClient, request: AppendRequest, locks: Locks, lock_req: LockRequest
    ) -> bool:
        """A lock failure (a lock committed above the client's high-water mark) is answered here."""
        lock_high_water_mark = locks.get_lock_high_water_mark(lock_req)
        if lock_high_water_mark > request.client_high_water_mark:
            self._rejection_meter.mark()
            locks.end(lock_req)
            client.send(LockFailure(request.req_id, lock_high_water_mark))
            return True
        return False

    async def _append(self, client: FeedClient, request: AppendRequest) -> None:
        locks = self._locks
        assert locks is not None
        lock_req = lock_request(request)
        while not locks.begin(lock_req):
            if self.pending_appends == 0:
                # Nothing in flight can hold these slots: the table is inconsistent.
                log.error(
                    "partition %d: failed to begin lock with nothing to flush (%d active); resetting",
                    self.partition_id,
                    locks.num_active_locks(),
                )
                locks.reset(self.commit_high_water_mark)
            else:
                await self._flush_store()
        if self._refused(client, request, locks, lock_req):
            return
        data = request.data if request.data is not None else b""
        try:
            future = await self.store.append(request.req_id, request.header, data, request.checksum)
        except BaseException:
            locks.end(lock_req)
            raise
        self._issued(request, locks, lock_req, data, future)

    def _issued(
        self,
        request: AppendRequest,
        locks: Locks,
        lock_req: LockRequest,
        data: bytes,
        future: asyncio.Future[int],
    ) -> None:
        """The store took the append (queued through the append task): count it, and decide it in
        the store's decision callback."""
        decided, number = self._decision(request, locks, lock_req, data, clock.monotonic_s())
        self._count_issued(number)

        def committed(done: asyncio.Future[int]) -> None:
            if done.cancelled():
                decided(FAILED_TRANSACTION_ID, asyncio.CancelledError(), True)
                return
            error = done.exception()
            if error is not None:
                decided(FAILED_TRANSACTION_ID, error, True)
                return
            decided(done.result(), None, getattr(done, "last_of_batch", True))

        # The store's own future runs it in the call that decides the vote (no turn between).
        getattr(future, "when_decided", future.add_done_callback)(committed)

    def _count_issued(self, number: list[int]) -> None:
        """An append went to the store: pending until its decision (:meth:`_decision`) runs, and
        numbered for the mounts and flushes behind it (only now: one the store refused must not
        hold them)."""
        if self.pending_appends == 0:  # (else clear already: only the last decision sets it)
            self._settled.clear()
        self.pending_appends += 1
        number[0] = self._barrier.issue()

    def _decision(
        self, request: AppendRequest, locks: Locks, lock_req: LockRequest, data: bytes, started_s: float
    ) -> tuple[AppendDecision, list[int]]:
        """What the store's decision of an append does, ``decided(transaction_id, error,
        last_of_batch)``, its latency from ``started_s``: the same for an append taken at once and
        one queued. Once the store took it, :meth:`_count_issued` numbers it (the list returned)."""
        number = [-1]

        def decided(transaction_id: int, error: BaseException | None, last_of_batch: bool) -> None:
            append_number = number[0]
            assert append_number >= 0, "decided before the store took it"
            # A batch is decided in one call (the vote's): its first decision reads the clock, the
            # others share it; the last one (and any outside a batch's call) ends the sharing.
            now_s = self._decision_now_s
            if now_s is None:
                now_s = clock.monotonic_s()
            self._decision_now_s = None if last_of_batch else now_s
            self.pending_appends -= 1
            if self.pending_appends == 0:
                self._settled.set()
            locks.end(lock_req)
            if error is not None:
                if isinstance(error, AppendOutcomeUnknownError):
                    # Unknowable for good, but final (its txid lies below the log's low-water
                    # mark: nothing of it commits later), so what waits behind it may be
                    # answered; its locks count as written there.
                    locks.may_have_committed(lock_req, error.transaction_id)
                    self._barrier.decide(append_number)
                    return
                self._outcome_unknown(append_number, request.req_id)
                return
            self._latency_timer.update_at(now_s, (now_s - started_s) * 1000.0)
            if transaction_id > self.commit_high_water_mark and not self.closed:
                self.feed_cache.add(self.partition_id, transaction_id, request.req_id, request.header)
                self.feed_frames.add_committed(transaction_id, request.req_id, request.header)
                self.fetcher.cache.put(self.partition_id, transaction_id, data, request.checksum)
                if lock_req is not NO_LOCK_REQUEST:  # (nothing to record without locks)
                    locks.commit(lock_req, transaction_id)
                self._success_meter.mark_at(now_s)
                self.commit_high_water_mark = transaction_id
                self._feed_due = True
                self.catch_up.wake()
            # (At or below the mark: a new session's recovery counted it already; feeds read it.)
            # Last: mounts released here see this transaction in the high-water mark.
            self._barrier.decide(append_number)
            if self._feed_due and last_of_batch:
                # The batch's feed leaves from its last commit's callback, in one write per
                # client (one per commit cost a TLS record and a send each: 16 appenders on one
                # partition lost 40 % of their rate).
                self._feed_due = False
                self.realtime.serve_now()

        return decided, number

    def _outcome_unknown(self, append_number: int, req_id: ReqId) -> None:
        """The store gave up on an append without deciding it: mounts and flushes behind it must
        not be answered here (the append may still commit). Only a closing partition does that;
        otherwise the partition is replaced, and the clients remount where recovery decides it."""
        self._barrier.undecidable(append_number)
        if self.closed:
            return
        log.error(
            "partition %d: the outcome of append %s is unknown; replacing the partition",
            self.partition_id,
            req_id,
        )
        on_failure, self.on_task_failure = self.on_task_failure, None
        if on_failure is not None:
            on_failure(self)

    # --- feeds ---------------------------------------------------------------------------

    def _start_mount_feed(self, client: FeedClient, request: MountRequest) -> None:
        fetch_size = self._decided_high_water_mark() - request.client_high_water_mark
        if fetch_size < 0:
            client.send(MountResponse(request.req_id, PARTITION_STATE_CLIENT_AHEAD))
        elif fetch_size == 0:
            client.send(MountResponse(request.req_id, PARTITION_STATE_READY))
        else:
            ready = MountResponse(request.req_id, PARTITION_STATE_READY)
            self._add_context(client, request.req_id, request.client_high_water_mark, fetch_size, ready)

    def _start_feed(self, client: FeedClient, request: FeedRequest) -> None:
        fetch_size = self.commit_high_water_mark - request.client_high_water_mark
        if fetch_size < 0:
            # The original throws "client is ahead of store" here and sends nothing.
            log.warning(
                "partition %d: feed request from a client ahead of the store: %s", self.partition_id, request
            )
            return
        fetch_size = max(fetch_size, self.settings.min_fetch_size)
        suspended = FeedSuspended(request.req_id)
        self._add_context(client, request.req_id, request.client_high_water_mark, fetch_size, suspended)

    def _add_context(
        self, client: FeedClient, req_id: ReqId, client_high_water_mark: int, fetch_size: int, terminal: Any
    ) -> None:
        context = FeedContext(client, req_id, client_high_water_mark, fetch_size, terminal, self._route)
        if client.writable():
            self._route(context)
        else:
            client.park(context)

    def _route(self, context: FeedContext) -> None:
        """Realtime if the context lags less than ``realtimeThreshold``, else catch-up."""
        if self.closed or context.client.closed:
            return
        if context.lag(self.commit_high_water_mark) < self.settings.realtime_threshold:
            self.realtime.add(context)
        else:
            self.catch_up.add(context)

    def num_feed_contexts(self) -> int:
        return self.realtime.num_contexts() + self.catch_up.num_contexts()
