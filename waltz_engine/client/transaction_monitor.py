"""Which of this client's appends are still pending, per partition (the original's TransactionMonitor, §3.5).

The server never says "appended"; the feed does. Appends of one partition are processed in
order, so when the feed shows one of ours, every older pending one of ours is proven absent. A
flush answer (or a mount, which implies one) proves absent everything up to the flushed request
that the feed did not show. Only a proven-absent append settles False (and may be retried); one
the client stops watching before a server decided it settles with OutcomeUnknownError.

Everything runs on the client's event loop: no locks, and waiters are futures, not threads.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from waltz_engine.client.commit_latency import CommitLatency
from waltz_engine.client.config import DEFAULT_LONG_WAIT_THRESHOLD_MS
from waltz_engine.client.errors import ClientClosedError, OutcomeUnknownError, PartitionInactiveError
from waltz_engine.common import clock
from waltz_engine.common.reqid import ReqId

if TYPE_CHECKING:
    from waltz_engine.client.transaction_context import TransactionContext

log = logging.getLogger(__name__)


def monotonic_ms() -> float:
    return clock.monotonic_s() * 1000


class TransactionFuture(asyncio.Future[bool]):
    """True: committed; False: proven absent (a retry may follow); OutcomeUnknownError: not decided
    when the client stopped watching; another exception: never sent.

    *Flushed* means the monitor forgot the request: the server can no longer commit it.
    """

    def __init__(self, req_id: ReqId, context: TransactionContext | None) -> None:
        super().__init__()
        self.req_id = req_id
        self.context = context
        # The loop's clock, which clock.monotonic_s reads on a loop (the simulator's virtual
        # one there), read without its two calls: once per append.
        self.registered_ms = self.get_loop().time() * 1000
        self._flushed = False
        self._flush_waiters: list[asyncio.Future[None]] = []

    @property
    def is_flushed(self) -> bool:
        return self._flushed

    def mark_flushed(self) -> None:
        self._flushed = True
        waiters = self._flush_waiters
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()

    async def wait_flushed(self, timeout_ms: int) -> bool:
        """Whether it was flushed within ``timeout_ms``."""
        if self._flushed:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await asyncio.shield(waiter)
        except TimeoutError:
            return False
        finally:
            if waiter in self._flush_waiters:
                self._flush_waiters.remove(waiter)
        return True

    def settle(self, result: bool) -> bool:
        """Complete unless already done; whether this call completed it."""
        if self.done():
            return False
        self.set_result(result)
        return True


class MonitorState(enum.Enum):
    STARTED = "started"
    STOPPED = "stopped"
    CLOSED = "closed"


class TransactionMonitor:
    """Registered appends in send order; at most ``max_concurrent_transactions`` undecided ones."""

    def __init__(
        self, max_concurrent_transactions: int, long_wait_ceiling_ms: int = DEFAULT_LONG_WAIT_THRESHOLD_MS
    ) -> None:
        assert max_concurrent_transactions >= 1
        self.max_capacity = max_concurrent_transactions
        self.latency = CommitLatency(long_wait_ceiling_ms)
        self.state = MonitorState.STOPPED
        self._registered: dict[ReqId, TransactionFuture] = {}  # insertion order = send order
        self._num_registered = 0  # registered and not yet completed (aborted ones stay until flushed)
        self._last_req_id: ReqId | None = None
        self._space: asyncio.Event | None = None
        # The appends waiting for room, in the order they came (register); one registers at a time.
        self._queue: deque[ReqId] = deque()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> bool:
        if self.state is not MonitorState.STOPPED:
            return False
        self.state = MonitorState.STARTED
        return True

    def stop(self) -> bool:
        if self.state is not MonitorState.STARTED:
            return False
        self.state = MonitorState.STOPPED
        self._wake()
        return True

    @property
    def is_stopped(self) -> bool:
        return self.state is MonitorState.STOPPED

    def close(self, reason: str = "the client closed", cause: BaseException | None = None) -> None:
        """No more appends; every undecided one ends with OutcomeUnknownError (``reason``)."""
        self.state = MonitorState.CLOSED
        self.abandon(reason, cause)

    def abandon(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop watching the undecided appends: a server may still commit them, so their outcome
        is unknown (never False: that would retry an append that may be in the log)."""
        for future in self._registered.values():
            if not future.done():
                error = OutcomeUnknownError(future.req_id, reason)
                error.__cause__ = cause
                future.set_exception(error)
            future.mark_flushed()
        self._registered.clear()
        self._num_registered = 0
        self._wake()

    # -- registration --------------------------------------------------------------------------

    def register_now(
        self, req_id: ReqId, context: TransactionContext | None, in_turn: bool = False
    ) -> TransactionFuture | None:
        """:meth:`register` when it need not wait: None when the monitor is full or others wait
        for room before it (the caller then awaits :meth:`register`, in its turn). ``in_turn``:
        :meth:`register`'s own call once its turn came (a slot is free, or the monitor stopped)."""
        state = self.state
        if (
            state is MonitorState.STARTED
            and not in_turn
            and (self._num_registered >= self.max_capacity or self._queue)
        ):
            return None
        future = TransactionFuture(req_id, context)
        if state is MonitorState.STARTED:
            if req_id in self._registered:
                log.error("duplicate reqId: %s", req_id)
                future.set_result(False)
            else:
                self._last_req_id = req_id
                self._registered[req_id] = future
                self._num_registered += 1
        elif state is MonitorState.STOPPED:
            future.set_exception(PartitionInactiveError(req_id.partition_id))
        else:
            future.set_exception(ClientClosedError())
        return future

    async def register(
        self,
        req_id: ReqId,
        context: TransactionContext | None,
        timeout_ms: int,
        on_full: Callable[[], Awaitable[None]] | None = None,
    ) -> TransactionFuture | None:
        """A future for ``req_id`` once a slot is free and every append that waited before it
        has registered: first come, first registered, so appends leave in the order they came
        (issue 33: a direct path must not let a second append pass one waiting for room).

        No slot within ``timeout_ms``: without ``on_full``, None (its place is given up); with
        it, ``on_full()`` is awaited (it may raise) and the wait goes on in the same place."""
        if (future := self.register_now(req_id, context)) is not None:
            return future
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        queue = self._queue
        queue.append(req_id)
        try:
            while self.state is MonitorState.STARTED and (
                self._num_registered >= self.max_capacity or queue[0] != req_id
            ):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.warning(
                        "transaction registration timeout: partition=%d after %d ms", req_id[2], timeout_ms
                    )
                    if on_full is None:
                        return None
                    await on_full()
                    deadline = loop.time() + timeout_ms / 1000
                    continue
                if self._space is None:
                    self._space = asyncio.Event()
                try:
                    async with asyncio.timeout(remaining):
                        await self._space.wait()
                except TimeoutError:
                    continue
            return self.register_now(req_id, context, in_turn=True)
        finally:
            queue.remove(req_id)
            if queue and (self.state is not MonitorState.STARTED or self._num_registered < self.max_capacity):
                self._wake()  # room left (or no more waiting): the next in line takes its turn

    # -- outcomes ------------------------------------------------------------------------------

    def get_transaction_context(self, req_id: ReqId) -> TransactionContext | None:
        future = self._registered.get(req_id)
        return future.context if future is not None else None

    def committed(self, req_id: ReqId) -> TransactionContext | None:
        """The feed showed ``req_id``: it succeeded and every older one failed; its context."""
        if self.state is MonitorState.CLOSED:
            return None
        future = self._registered.get(req_id)
        if future is None:
            return None
        if not future.done():
            self.latency.observe(future.get_loop().time() * 1000 - future.registered_ms)
        self._complete_through(req_id, True)
        return future.context

    def abort(self, req_id: ReqId) -> None:
        """``req_id`` failed (lock failure); it stays registered, flushed later, as the original."""
        if self.state is MonitorState.CLOSED:
            return
        future = self._registered.get(req_id)
        if future is not None and future.settle(False):
            self._num_registered -= 1
            self._wake()

    def refuse(self, req_id: ReqId, error: BaseException) -> None:
        """The server refused ``req_id`` before serving it (its ACLs): certainly not committed, and
        ``error`` (never False, which would retry it) is its outcome."""
        future = self._registered.pop(req_id, None)
        if future is None:
            return
        if not future.done():
            future.set_exception(error)
            self._num_registered -= 1
        future.mark_flushed()
        self._wake()

    def flush(self, req_id: ReqId) -> None:
        """A flush answered for ``req_id``: it and everything older are decided (failed if pending)."""
        if self.state is not MonitorState.CLOSED and req_id in self._registered:
            self._complete_through(req_id, False)

    def _complete_through(self, req_id: ReqId, success: bool) -> None:
        while self._registered:
            other = next(iter(self._registered))
            future = self._registered.pop(other)
            future.mark_flushed()
            last = other == req_id
            # Appends of a partition are processed in order: an older pending one failed.
            if not future.done():  # settle(), without its call (once per commit)
                future.set_result(success if last else False)
                self._num_registered -= 1
            if last:
                break
        if self._space is not None:
            self._wake()

    # -- queries -------------------------------------------------------------------------------

    def last_enqueued(self) -> TransactionFuture | None:
        return self._registered.get(self._last_req_id) if self._last_req_id is not None else None

    def oldest_undecided(self) -> TransactionFuture | None:
        """The first registered append that is not settled yet (lock failures are settled)."""
        return next((f for f in self._registered.values() if not f.done()), None)

    @property
    def registered_count(self) -> int:
        return self._num_registered

    def _wake(self) -> None:
        if self._space is not None:
            self._space.set()
            self._space = None
