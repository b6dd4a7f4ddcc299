"""The stream client's view of one partition (the original's ``CL/internal/Partition.java``).

It holds the client high-water mark (the last transaction applied through the callbacks),
the mount state of the partition's current network client and the transaction monitor, and
decides when a pending append is proven absent: feed, flush answers (deferred until the client
has applied up to the flushed high-water mark) and lock failures (deferred until the client has
applied the conflicting transaction, so a retry builds on data at least that new). Its one
long-wait timer asks the server to decide an append that waits much longer than the partition's
recent commits took (client/commit_latency.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from waltz_engine.client.config import DEFAULT_LONG_WAIT_THRESHOLD_MS
from waltz_engine.client.errors import (
    AuthorizationError,
    ClientClosedError,
    ClientTimeoutError,
    PartitionInactiveError,
    PartitionStoppedError,
)
from waltz_engine.client.transaction_monitor import TransactionFuture, TransactionMonitor, monotonic_ms
from waltz_engine.client.unfinished import Unfinished
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import AppendRequest, FeedData, FlushRequest, LockFailure

if TYPE_CHECKING:
    from waltz_engine.client.network_client import NetworkClient
    from waltz_engine.client.transaction_context import TransactionContext

log = logging.getLogger(__name__)

# Builds a named tuple from its fields' tuple without its generated __new__'s Python call.
_new_tuple = tuple.__new__

INT32_MIN = -(1 << 31)
INT32_RANGE = 1 << 32
NO_HIGH_WATER_MARK = -1

# Hands one transaction to the application: None when that is done, else what to await for it.
Deliver = Callable[[int, int, ReqId], Awaitable[None] | None]
# A callback's awaitable left by a run applied in a read callback: (its index in the run, the
# awaitable, the transaction's context).
_Step = tuple[int, Awaitable[None], "TransactionContext | None"]


class ApplicationError(Exception):
    """``apply_transaction`` raised on ``transaction_id`` (the cause); the feed stops there."""

    def __init__(self, transaction_id: int) -> None:
        super().__init__(transaction_id)
        self.transaction_id = transaction_id


def next_seq_num(seq_num: int) -> int:
    """Java's ``AtomicInteger.incrementAndGet``: wraps from 2^31 - 1 to -2^31."""
    return (seq_num + 1 - INT32_MIN) % INT32_RANGE + INT32_MIN


def call_hook(hook: Callable[..., Any], *args: Any) -> None:
    """An application hook that raises must not break the client's bookkeeping."""
    try:
        hook(*args)
    except Exception:
        hook_failed(hook)


def hook_failed(hook: Callable[..., Any]) -> None:
    """Log what ``hook`` raised (in its ``except``): the feed's direct path calls its two hooks
    in a ``try`` of its own, as :func:`call_hook` does, without a call around each."""
    log.exception("transaction context hook %s failed", getattr(hook, "__qualname__", hook))


class PartitionState(enum.Enum):
    ACTIVE = "active"
    INACTIVE = "inactive"
    CLOSED = "closed"
    STOPPED = "stopped"  # apply_transaction kept raising: given up (see MAX_APPLICATION_ATTEMPTS)


class Partition:
    def __init__(
        self,
        partition_id: int,
        client_id: int,
        max_concurrent_transactions: int,
        long_wait_ceiling_ms: int = DEFAULT_LONG_WAIT_THRESHOLD_MS,
    ) -> None:
        self.partition_id = partition_id
        self.client_id = client_id
        self.generation = -1
        self.state = PartitionState.INACTIVE
        self.client_high_water_mark = NO_HIGH_WATER_MARK
        self.monitor = TransactionMonitor(max_concurrent_transactions, long_wait_ceiling_ms)
        self.network_client: NetworkClient | None = None
        self.mounted = False
        self.client_ahead = False
        self.session: ReqId | None = None  # the ReqId of the MountRequest whose answers count
        self.lock_failures = 0
        self.registration_timeouts = 0
        self.application_failures = 0  # apply_transaction raised on the next transaction, in a row
        self.long_wait_flushes = 0  # FlushRequests the long-wait timer sent
        self.last_own_commit = NO_HIGH_WATER_MARK  # txid of this client's latest committed append
        self.applied_listener: Callable[[], None] | None = None  # told when one of ours was applied
        self._long_wait_timer: asyncio.TimerHandle | None = None
        self._long_wait_flushed: ReqId | None = None  # the oldest append the timer last flushed for
        self._long_wait_backoff = 1  # doubles while a flush for the same append goes unanswered
        self.stopped: PartitionStoppedError | None = None
        # The server's ACLs refused this client the partition's mount or feed (issue 34): no more
        # mounts; waits for one raise it.
        self.refused_read: AuthorizationError | None = None
        self._seq_num = 0
        self._lock_failure_queue: list[tuple[int, int, ReqId]] = []  # (lock hwm, arrival, reqId)
        self._arrivals = 0
        self._flush_points: deque[tuple[int, ReqId]] = deque()
        self._application_failed: dict[ReqId, TransactionContext] = {}
        self._application_lock = ApplicationLock()
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return f"Partition(p={self.partition_id}, c={self.client_id}, hwm={self.client_high_water_mark})"

    def next_req_id(self) -> ReqId:
        self._seq_num = seq_num = next_seq_num(self._seq_num)
        # tuple.__new__: the same ReqId without its generated __new__'s Python call (once a submit).
        return _new_tuple(ReqId, (self.client_id, self.generation, self.partition_id, seq_num))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self.state is PartitionState.ACTIVE

    def activate(self, client_high_water_mark: int) -> None:
        if self.monitor.start():
            self.client_high_water_mark = client_high_water_mark
            self.state = PartitionState.ACTIVE
            self._notify()

    async def deactivate(self, flush_timeout_ms: int) -> None:
        """Stop taking appends and wait (bounded) until the pending ones are decided."""
        if self.monitor.stop():
            future = self.flush_async()
            while self.monitor.is_stopped and future is not None:
                if not await future.wait_flushed(flush_timeout_ms):
                    log.warning(
                        "%r: pending appends undecided after %d ms; their outcome is unknown",
                        self,
                        flush_timeout_ms,
                    )
                    self.monitor.abandon(f"no server decided it within {flush_timeout_ms} ms")
                    break
                future = self.flush_async()
        self.process_auxiliary_queues()
        if self.monitor.is_stopped:
            self.state = PartitionState.INACTIVE
            self.mounted = False
            self._notify()

    def close(self) -> None:
        self.network_client = None
        self.state = PartitionState.CLOSED
        self.mounted = False
        self.client_ahead = False
        self._cancel_long_wait()
        self.monitor.close()
        self._notify()

    def stop(self, error: PartitionStoppedError) -> None:
        """Give the partition up: no more mounts, feed or appends; pending appends fail with ``error``."""
        self.stopped = error
        self.state = PartitionState.STOPPED
        self.mounted = False
        self._cancel_long_wait()
        self.monitor.close(f"partition {self.partition_id} stopped", error)
        self._notify()

    def read_refused(self, error: AuthorizationError) -> None:
        """The server's ACLs refuse this client the partition's mount or feed: the feed ends, no
        more mounts, and undecided appends end with OutcomeUnknownError (sent before the refusal,
        they may have committed)."""
        self.refused_read = error
        self.mounted = False
        self._cancel_long_wait()
        self.monitor.abandon(f"partition {self.partition_id}: {error}", error)
        self._notify()

    def refused(self) -> None:
        """The partition's server refuses this client at TLS: waiting mounts learn it now."""
        self._notify()

    # -- mounting --------------------------------------------------------------------------

    def mounting(self, network_client: NetworkClient | None) -> None:
        self.mounted = False
        self.client_ahead = False
        self.session = None
        self.network_client = network_client
        self._notify()

    def mounted_by(self, network_client: NetworkClient) -> None:
        if self.network_client is network_client:
            log.info("partition mounted: %r on %r", self, network_client)
            self.mounted = True
            self._notify()
        # Whatever the server had from us before the mount is decided now.
        self.flush_async()

    def partition_ahead(self) -> None:
        self.client_ahead = True
        self._notify()

    async def ensure_mounted(
        self, timeout_ms: int, check_ahead: Callable[[Partition], Awaitable[None]]
    ) -> None:
        if self.mounted and self.state is PartitionState.ACTIVE:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not self.mounted:
            if self.state is PartitionState.CLOSED:
                raise ClientClosedError()
            if self.stopped is not None:
                raise self.stopped
            if self.refused_read is not None:
                raise self.refused_read
            if self.monitor.is_stopped:
                raise PartitionInactiveError(self.partition_id)
            if self.client_ahead:
                await check_ahead(self)  # remounts if the server caught up, else raises ClientAheadError
                continue
            network_client = self.network_client
            if network_client is not None and network_client.refused is not None:
                raise network_client.refused
            remaining = deadline - loop.time()
            if remaining <= 0:
                where = network_client.endpoint if network_client else "no server assigned"
                last_error = network_client.last_connect_error if network_client else None
                if last_error is not None and not network_client.ready:  # type: ignore[union-attr]
                    where += f"; last connect failed: {last_error}"
                raise ClientTimeoutError(
                    f"partition {self.partition_id} was not mounted within {timeout_ms} ms ({where})"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
        if self.state is PartitionState.CLOSED:
            raise ClientClosedError()

    # -- appends ---------------------------------------------------------------------------

    async def append(
        self,
        request: AppendRequest,
        context: TransactionContext | None,
        registration_timeout_ms: int,
        on_full: Callable[[], Awaitable[None]] | None = None,
    ) -> TransactionFuture | None:
        """Register (in turn, see ``TransactionMonitor.register``) and send; None when the
        registration timed out and there is no ``on_full`` (the caller flushes and retries)."""
        future = self.monitor.register_now(request.req_id, context)
        if future is None:

            async def full() -> None:
                self.registration_timeouts += 1
                if on_full is not None:
                    await on_full()

            future = await self.monitor.register(
                request.req_id, context, registration_timeout_ms, None if on_full is None else full
            )
            if future is None:
                self.registration_timeouts += 1
                return None
        self._send(request, future)
        return future

    def append_now(
        self, request: AppendRequest, context: TransactionContext | None
    ) -> TransactionFuture | None:
        """:meth:`append` when it need not wait (None: the monitor is full or others wait for
        room first; the caller awaits :meth:`append`, which sends it in its turn)."""
        future = self.monitor.register_now(request.req_id, context)
        if future is not None:
            self._send(request, future)
        return future

    def _send(self, request: AppendRequest, future: TransactionFuture) -> None:
        if future.done():
            return  # refused at registration (inactive, closed, a duplicate): nothing to send
        network_client = self.network_client
        if network_client is None or not network_client.send(request, write_now=True):
            # Not sent: the connection is gone, but this partition may still count as mounted
            # until the connection's reader gets past an apply_transaction that waits on the
            # dead server. Failing it now would retry at once, and again, without end (a retry
            # storm). As the original, leave it pending: the next mount flushes it and only
            # then is it retried, at most once per remount.
            log.debug(
                "%r: append %s not sent (no connection); the next mount decides it", self, request.req_id
            )
        if self._long_wait_timer is None:
            self._arm_long_wait(self.monitor.latency.long_wait_ms())

    def flush_async(self) -> TransactionFuture | None:
        """Ask the server to decide every pending append; the future of the last one, if any."""
        future = self.monitor.last_enqueued()
        if (
            future is None
            or future.is_flushed
            or self.state in (PartitionState.CLOSED, PartitionState.STOPPED)
        ):
            return None
        network_client = self.network_client
        if network_client is None or not network_client.send(FlushRequest(future.req_id)):
            log.debug("%r: cannot send FlushRequest now; the mount will flush", self)
        return future

    # -- the long-wait timer: one per partition, armed while an append is undecided ------------

    def _arm_long_wait(self, delay_ms: float) -> None:
        loop = asyncio.get_running_loop()
        self._long_wait_timer = loop.call_later(max(delay_ms, 0) / 1000, self._long_wait_due)

    def _cancel_long_wait(self) -> None:
        if self._long_wait_timer is not None:
            self._long_wait_timer.cancel()
            self._long_wait_timer = None

    def _long_wait_due(self) -> None:
        """Flush when the oldest undecided append waited too long; re-arm for the next check."""
        self._long_wait_timer = None
        if self.state in (PartitionState.CLOSED, PartitionState.STOPPED):
            return
        oldest = self.monitor.oldest_undecided()
        if oldest is None:
            return
        if oldest.req_id != self._long_wait_flushed:
            self._long_wait_backoff = 1
        latency = self.monitor.latency
        wait_ms = min(latency.long_wait_ms() * self._long_wait_backoff, latency.ceiling_ms)
        waited_ms = monotonic_ms() - oldest.registered_ms
        if waited_ms < wait_ms:
            self._arm_long_wait(wait_ms - waited_ms)
            return
        if self.mounted:
            log.debug("%r: %s waited %.0f ms; asking the server to decide it", self, oldest.req_id, waited_ms)
            self.long_wait_flushes += 1
            self.flush_async()
        self._long_wait_flushed = oldest.req_id
        self._long_wait_backoff *= 2
        self._arm_long_wait(min(wait_ms * 2, latency.ceiling_ms))

    def flush_completed(self, req_id: ReqId, high_water_mark: int) -> None:
        if self.client_high_water_mark >= high_water_mark:
            self.monitor.flush(req_id)
        else:
            self._flush_points.append((high_water_mark, req_id))

    def lock_failed(self, lock_failure: LockFailure) -> None:
        context = self.monitor.get_transaction_context(lock_failure.req_id)
        if context is not None:
            self.lock_failures += 1
            call_hook(context.on_lock_failure)
        if self.client_high_water_mark >= lock_failure.transaction_id:
            self.monitor.abort(lock_failure.req_id)
        else:
            self._arrivals += 1
            heapq.heappush(
                self._lock_failure_queue, (lock_failure.transaction_id, self._arrivals, lock_failure.req_id)
            )

    def process_auxiliary_queues(self) -> None:
        queue = self._lock_failure_queue
        while queue and queue[0][0] <= self.client_high_water_mark:
            self.monitor.abort(heapq.heappop(queue)[2])
        points = self._flush_points
        while points and points[0][0] <= self.client_high_water_mark:
            self.monitor.flush(points.popleft()[1])

    @property
    def has_pending_transactions(self) -> bool:
        return self.monitor.registered_count > 0

    @property
    def own_commit_unapplied(self) -> bool:
        """One of this client's committed transactions still waits for ``apply_transaction``."""
        return self.is_active and self.client_high_water_mark < self.last_own_commit

    # -- the feed --------------------------------------------------------------------------

    async def apply_transactions(self, feed: Sequence[FeedData], deliver: Deliver) -> None:
        """Apply the next transactions in order (others are duplicates or gaps and are ignored).

        A feed batch takes the partition's application lock once; a callback that returns no
        awaitable costs no await. Raises ApplicationError (from the callback's error) at the first
        transaction whose callback raised: the ones after it are not applied.
        """
        await self._application_lock.acquire()
        try:
            step = self._apply_from(feed, 0, deliver)
            while step is not None:
                step = await self._finish_step(feed, step, deliver)
        finally:
            self._application_lock.release()

    def apply_now(self, feed: Sequence[FeedData], deliver: Deliver) -> Unfinished | None:
        """:meth:`apply_transactions` in this very call (a connection's read callback), as far as
        no callback returns something to await: None when the whole run was applied, else what
        is left, holding the application lock, for the reader task to await. With the lock held
        elsewhere (the feed of another connection still applying), all of it is left.
        Raises as :meth:`apply_transactions` does."""
        lock = self._application_lock
        # ``lock.try_acquire`` and, with no waiter, ``lock.release`` written out (one of each per
        # feed read: a lone commit's own path).
        if lock._held or lock._waiters:
            return Unfinished(self.apply_transactions(feed, deliver))
        lock._held = True
        try:
            step = self._apply_from(feed, 0, deliver)
        except BaseException:
            lock.release()
            raise
        if step is None:
            if lock._waiters:
                lock.release()  # handed on
            else:
                lock._held = False
            return None
        return Unfinished(self._apply_rest(feed, step, deliver), partial(self._abandon_step, feed, step))

    async def _apply_rest(self, feed: Sequence[FeedData], step: _Step, deliver: Deliver) -> None:
        """The rest of :meth:`apply_now`'s run, from the callback it left waiting (lock held)."""
        try:
            next_step: _Step | None = step
            while next_step is not None:
                next_step = await self._finish_step(feed, next_step, deliver)
        finally:
            self._application_lock.release()

    def _apply_from(self, feed: Sequence[FeedData], start: int, deliver: Deliver) -> _Step | None:
        """Apply ``feed[start:]`` up to a callback that returns something to await: that one's
        (index, awaitable, context), or None when all were applied."""
        monitor = self.monitor
        client_id = self.client_id
        for index in range(start, len(feed)):
            req_id, transaction_id, header = feed[index]
            if self.state is not PartitionState.ACTIVE or transaction_id != self.client_high_water_mark + 1:
                continue
            context = None
            if req_id.client_id == client_id:  # others' transactions were never registered here
                context = monitor.committed(req_id)
                if context is not None:
                    self.last_own_commit = transaction_id
                    try:  # (``call_hook``, written out: once a commit)
                        context.on_completion(True)
                    except Exception:
                        hook_failed(context.on_completion)
                else:
                    # The application failed on it before: the context still wants on_application.
                    context = self._application_failed.pop(req_id, None)
            try:
                pending = deliver(transaction_id, header, req_id)
            except BaseException as e:
                self._application_raised(req_id, transaction_id, context, e)
            if pending is not None:
                return index, pending, context
            self._applied(context)
        return None

    async def _finish_step(self, feed: Sequence[FeedData], step: _Step, deliver: Deliver) -> _Step | None:
        """Await the callback ``step`` left, then apply on from the transaction after it."""
        index, pending, context = step
        try:
            await pending
        except BaseException as e:
            req_id, transaction_id, _ = feed[index]
            self._application_raised(req_id, transaction_id, context, e)
        self._applied(context)
        return self._apply_from(feed, index + 1, deliver)

    def _applied(self, context: TransactionContext | None) -> None:
        self.client_high_water_mark += 1
        self.application_failures = 0
        if context is not None:
            try:  # (``call_hook``, written out: once a commit)
                context.on_application()
            except Exception:
                hook_failed(context.on_application)
            if self.applied_listener is not None:
                self.applied_listener()
        if self._lock_failure_queue or self._flush_points:
            self.process_auxiliary_queues()

    def _application_raised(
        self, req_id: ReqId, transaction_id: int, context: TransactionContext | None, error: BaseException
    ) -> NoReturn:
        self.application_failures += 1
        if context is not None:
            self._application_failed[req_id] = context
        self.process_auxiliary_queues()
        if isinstance(error, Exception):
            raise ApplicationError(transaction_id) from error
        raise error

    def _abandon_step(self, feed: Sequence[FeedData], step: _Step) -> None:
        """An :meth:`apply_now` rest given up unstarted (its connection closed first): what a
        cancellation of the reader task awaiting it would have done."""
        index, pending, context = step
        if isinstance(pending, Coroutine):
            pending.close()
        elif isinstance(pending, asyncio.Future):
            pending.cancel()
        req_id, transaction_id, _ = feed[index]
        try:
            self._application_raised(req_id, transaction_id, context, asyncio.CancelledError())
        except asyncio.CancelledError:
            pass
        finally:
            self._application_lock.release()


class ApplicationLock:
    """A partition's application lock: asyncio.Lock's first-come order, plus a synchronous
    :meth:`try_acquire` for a read callback (no waiter can be passed: a waiter is handed the
    lock by :meth:`release` itself)."""

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        if self._held or self._waiters:
            return False
        self._held = True
        return True

    async def acquire(self) -> None:
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the lock, then cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        assert self._held, "release of an application lock not held"
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # handed over: still held
                return
        self._held = False
