"""Feed contexts and the two feed workers of a partition (reference §2.5, the original's
``FeedContext`` and ``FeedTask``).

A feed context streams ``FeedData`` for txids ``client HWM + 1 .. end`` to one client, then one
terminating message (``MountResponse(READY)`` for a mount, ``FeedSuspended`` for a feed
request). A context whose lag is below ``realtimeThreshold`` is served by the realtime worker,
which waits for commits; others by the catch-up worker, which reads storage on cache misses and
hands a context over once it is close enough. Each worker is one task woken in batches (a
commit or a new context sets one event), never a task per context or per transaction.

Back pressure: before every frame a worker checks that the client's write buffer is below its
high-water mark; if not, the context is parked on the client, which resumes it once the buffer
drained. So a client that does not read costs at most one write buffer, never an unbounded one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feed_cache import (
    FEED_CACHE_BLOCK_INDEX_MASK,
    FEED_CACHE_BLOCK_NUM_TRANSACTIONS,
    FeedCache,
)
from waltz_engine.wire.client_messages import CLIENT_CODECS, FeedData

log = logging.getLogger(__name__)

# Transactions one context is sent before the worker turns to the next context (fairness).
FEED_BATCH_NUM_TRANSACTIONS = FEED_CACHE_BLOCK_NUM_TRANSACTIONS


class FeedClient(Protocol):
    """The connection side a feed needs (implemented by the handler's ClientConnection)."""

    @property
    def version(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def writable(self) -> bool: ...

    def send(self, message: Any) -> None: ...

    def send_frame(self, frame: bytes) -> None: ...

    def park(self, context: FeedContext) -> None: ...


class FeedContext:
    """One feed in progress: txids ``next_transaction_id .. end_transaction_id`` then ``terminal``."""

    __slots__ = ("client", "req_id", "next_transaction_id", "end_transaction_id", "terminal", "resume")

    def __init__(
        self,
        client: FeedClient,
        req_id: ReqId,
        client_high_water_mark: int,
        fetch_size: int,
        terminal: Any,
        resume: Callable[[FeedContext], None],
    ) -> None:
        assert fetch_size > 0, fetch_size
        self.client = client
        self.req_id = req_id
        self.next_transaction_id = client_high_water_mark + 1
        self.end_transaction_id = client_high_water_mark + fetch_size
        self.terminal = terminal
        # Called by the client when a parked context may go on (the partition routes it again).
        self.resume = resume

    @property
    def finished(self) -> bool:
        return self.next_transaction_id > self.end_transaction_id

    def lag(self, high_water_mark: int) -> int:
        return high_water_mark - self.next_transaction_id + 1

    def __repr__(self) -> str:
        return f"FeedContext({self.req_id}, next={self.next_transaction_id}, end={self.end_transaction_id})"


class FeedSource(Protocol):
    """What a worker reads: the partition's committed HWM and storage for cache misses."""

    partition_id: int

    @property
    def high_water_mark(self) -> int: ...

    def record_headers(self, transaction_id: int, max_num: int) -> Awaitable[Sequence[RecordHeader]]: ...


class FeedWorker:
    """Serves a set of feed contexts in rounds; ``realtime`` only changes where lagging ones go."""

    __slots__ = (
        "name",
        "realtime",
        "source",
        "feed_cache",
        "realtime_threshold",
        "contexts",
        "handover",
        "total_added",
        "total_removed",
        "_wake",
        "_frames",
    )

    def __init__(
        self,
        name: str,
        realtime: bool,
        source: FeedSource,
        feed_cache: FeedCache,
        realtime_threshold: int,
        handover: Callable[[FeedContext], None],
    ) -> None:
        self.name = name
        self.realtime = realtime
        self.source = source
        self.feed_cache = feed_cache
        self.realtime_threshold = realtime_threshold
        self.contexts: deque[FeedContext] = deque()
        # Where a context goes when it belongs to the other worker (the partition's router).
        self.handover = handover
        self.total_added = 0
        self.total_removed = 0
        self._wake = asyncio.Event()
        # (txid, codec version) -> FeedData frame, for one round: every realtime client at the same
        # txid gets the same bytes, encoded once.
        self._frames: dict[tuple[int, int], bytes] = {}

    def add(self, context: FeedContext) -> None:
        self.contexts.append(context)
        self.total_added += 1
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if await self._round():
                self._wake.set()
                await asyncio.sleep(0)  # more to send: let appends and other feeds run first

    async def _round(self) -> bool:
        """Serves every context once; True when some context could go on right away."""
        more = False
        self._frames.clear()
        for _ in range(len(self.contexts)):
            context = self.contexts.popleft()
            if await self._serve(context):
                self.contexts.append(context)
                more |= context.next_transaction_id <= self.source.high_water_mark
        return more

    def _remove(self) -> None:
        self.total_removed += 1

    async def _serve(self, context: FeedContext) -> bool:
        """Sends one batch; True if the context stays with this worker."""
        client = context.client
        if client.closed:
            self._remove()
            return False
        sent = 0
        while not context.finished:
            high_water_mark = self.source.high_water_mark
            if context.next_transaction_id > high_water_mark or sent == FEED_BATCH_NUM_TRANSACTIONS:
                break
            if not client.writable():
                self._remove()
                client.park(context)
                return False
            frame = await self._frame(context.next_transaction_id, client.version)
            if frame is None:
                # Storage did not have it (yet): try again on the next round.
                return True
            if client.closed:
                self._remove()
                return False
            client.send_frame(frame)
            context.next_transaction_id += 1
            sent += 1
        if context.finished:
            self._remove()
            client.send(context.terminal)
            return False
        lagging = context.lag(self.source.high_water_mark) >= self.realtime_threshold
        if lagging == self.realtime:
            self._remove()
            self.handover(context)
            return False
        return True

    async def _frame(self, transaction_id: int, version: int) -> bytes | None:
        key = (transaction_id, version)
        frame = self._frames.get(key)
        if frame is not None:
            return frame
        partition_id = self.source.partition_id
        cached = self.feed_cache.get(partition_id, transaction_id)
        if cached is not None:
            req_id, header = cached
        else:
            # Prefetch the rest of the cache block, as the original does.
            prefetch = FEED_CACHE_BLOCK_NUM_TRANSACTIONS - (transaction_id & FEED_CACHE_BLOCK_INDEX_MASK)
            headers = await self.source.record_headers(transaction_id, prefetch)
            if not headers or headers[0].transaction_id != transaction_id:
                log.warning("%s: storage has no header for txid %d", self.name, transaction_id)
                return None
            self.feed_cache.add_all(partition_id, headers)
            req_id, header = headers[0].req_id, headers[0].header
        frame = CLIENT_CODECS[version].encode_frame(FeedData(req_id, transaction_id, header))
        self._frames[key] = frame
        return frame

    def num_contexts(self) -> int:
        return len(self.contexts)
