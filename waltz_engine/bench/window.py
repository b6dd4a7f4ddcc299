"""An appender's window of transactions in flight (the original's semaphore of
``maxInFlight`` permits), opened by the transaction's outcome hook."""

from __future__ import annotations

import asyncio


class Window:
    """At most ``size`` transactions in flight; :meth:`release`, in a transaction's one final
    outcome hook, gives its place back.

    ``asyncio.Semaphore`` did the same with about ten Python calls more per transaction (its
    coroutine, ``locked``, its waiters' deque, ``_wake_up_next``), all counted in the bench's
    client CPU; here a full window costs one future, woken by the release. One task waits on
    it (its appender).
    """

    __slots__ = ("free", "_waiter")

    def __init__(self, size: int) -> None:
        assert size >= 1
        self.free = size
        self._waiter: asyncio.Future[None] | None = None

    def release(self) -> None:
        self.free += 1
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def acquire(self) -> None:
        """Take a place, once one is free."""
        while not self.free:
            assert self._waiter is None, "one task waits on a window"
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        self.free -= 1
