"""Transaction data asked for ahead of ``apply_transaction``, per partition (``client.dataPrefetchBytes``).

The feed tells the client which transactions come next before the application asks for their
data, so the client sends their TRANSACTION_DATA_REQUESTs ahead, many in flight, and
``Transaction.data()`` mostly finds its answer there already: one round trip per window, not per
transaction. The wire protocol is the original's; only when requests are sent changes.

Bounded: the bytes of answers held plus, for each request in flight, an estimate of its size (a
running mean of the sizes seen, ``INITIAL_SIZE_ESTIMATE_BYTES`` before any) stay within the budget,
and at most ``MAX_IN_FLIGHT`` requests are outstanding. A partition prefetches only while its
application reads data: a transaction applied without its data being asked for stops prefetching
until ``data()`` is called again, so a client that only reads headers costs nothing. A remount
starts the window again from the transactions the new feed delivers.
"""

from __future__ import annotations

import asyncio

# What a request in flight is assumed to bring back before any answer was seen.
INITIAL_SIZE_ESTIMATE_BYTES = 1024
# Requests outstanding per partition at most, whatever the budget (small transactions).
MAX_IN_FLIGHT = 256
# Weight of a new answer's size in the running mean (1/8: a few large ones move it quickly).
ESTIMATE_WEIGHT = 0.125


class DataPrefetch:
    """One partition's window: txid -> the future of its data, in txid order. One event loop owns it."""

    __slots__ = (
        "budget_bytes",
        "ahead",
        "_arrived",
        "held_bytes",
        "in_flight",
        "next_transaction_id",
        "last_seen_transaction_id",
        "estimate_bytes",
        "reading",
    )

    def __init__(self, budget_bytes: int) -> None:
        assert budget_bytes > 0, budget_bytes
        self.budget_bytes = budget_bytes
        self.ahead: dict[int, asyncio.Future[bytes]] = {}
        self._arrived: dict[int, int] = {}  # txid in ahead -> bytes its answer holds
        self.held_bytes = 0
        self.in_flight = 0
        self.next_transaction_id = 0  # the next one to ask for
        self.last_seen_transaction_id = -1  # the feed's latest
        self.estimate_bytes = float(INITIAL_SIZE_ESTIMATE_BYTES)
        self.reading = False  # the application asks for data: set by its first data() call

    @property
    def depth(self) -> int:
        """Transactions asked for ahead and not taken yet (answered or in flight)."""
        return len(self.ahead)

    def feed_seen(self, applied_through: int, last_transaction_id: int) -> None:
        """The feed delivered up to ``last_transaction_id``; applied so far: to ``applied_through``."""
        if self.ahead and next(iter(self.ahead)) <= applied_through:
            # Applied without asking for the data: this application does not read it (now).
            self._drop_through(applied_through)
            self.reading = False
        if last_transaction_id > self.last_seen_transaction_id:
            self.last_seen_transaction_id = last_transaction_id
        if self.next_transaction_id <= applied_through:
            self.next_transaction_id = applied_through + 1

    def take(self, transaction_id: int) -> asyncio.Future[bytes] | None:
        """The prefetched future of ``transaction_id`` (None if not asked for); those before it go."""
        self.reading = True
        ahead = self.ahead
        if not ahead:
            future = None
        elif next(iter(ahead)) == transaction_id:  # the usual case: read in order
            future = ahead.pop(transaction_id)
            self._release(transaction_id)
        else:
            self._drop_through(transaction_id - 1)
            future = ahead.pop(transaction_id, None)
            if future is not None:
                self._release(transaction_id)
        if self.next_transaction_id <= transaction_id:
            self.next_transaction_id = transaction_id + 1
        return future

    def wanted(self) -> range:
        """The txids to ask for now (reserved as in flight: pass each future to :meth:`requested`)."""
        if not self.reading:
            return range(0)
        first = self.next_transaction_id
        room = min(
            self.last_seen_transaction_id + 1 - first,
            MAX_IN_FLIGHT - self.in_flight,
            int((self.budget_bytes - self.held_bytes) / self.estimate_bytes) - self.in_flight,
        )
        if room <= 0:
            return range(0)
        self.in_flight += room
        self.next_transaction_id = first + room
        return range(first, first + room)

    def requested(self, transaction_id: int, future: asyncio.Future[bytes]) -> None:
        self.ahead[transaction_id] = future

    def arrived(self, transaction_id: int, size_bytes: int | None) -> None:
        """An answer for ``transaction_id`` came (``size_bytes`` None: an error answer)."""
        if transaction_id not in self.ahead or transaction_id in self._arrived:
            return  # not asked ahead, or taken already: its bytes are the application's
        held = size_bytes or 0
        self._arrived[transaction_id] = held
        self.held_bytes += held
        self.in_flight -= 1
        if size_bytes is not None:
            self.estimate_bytes += (max(size_bytes, 1) - self.estimate_bytes) * ESTIMATE_WEIGHT

    def reset(self) -> list[asyncio.Future[bytes]]:
        """Forgets the window (a remount); the futures dropped, for the caller to let go of."""
        dropped = list(self.ahead.values())
        self.ahead.clear()
        self._arrived.clear()
        self.held_bytes = 0
        self.in_flight = 0
        self.next_transaction_id = 0
        self.last_seen_transaction_id = -1
        return dropped

    def _drop_through(self, transaction_id: int) -> None:
        ahead = self.ahead  # in txid order: asked for in order, and emptied by a reset
        while ahead:
            first = next(iter(ahead))
            if first > transaction_id:
                break
            del ahead[first]
            self._release(first)

    def _release(self, transaction_id: int) -> None:
        held = self._arrived.pop(transaction_id, None)
        if held is None:
            self.in_flight -= 1  # its answer, should it come, is no longer counted
        else:
            self.held_bytes -= held
