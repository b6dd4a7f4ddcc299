"""Feed contexts and the two feed workers of a partition (reference §2.5, the original's
``FeedContext`` and ``FeedTask``).

A feed context streams ``FeedData`` for txids ``client HWM + 1 .. end`` to one client, then one
terminating message (``MountResponse(READY)`` for a mount, ``FeedSuspended`` for a feed
request). A context whose lag is below ``realtimeThreshold`` is served by the realtime worker,
which waits for commits; others by the catch-up worker, which reads storage on cache misses and
hands a context over once it is close enough. Each worker is one task woken in batches (a
commit or a new context sets one event), never a task per context or per transaction.

Fan-out costs once: a round sends each context the frames from its position up to the committed
high-water mark (at most one feed cache block) as one slice of the partition's shared encoded
frames (:mod:`feed_frames`): one write per context per round, the frames encoded once for all
clients, the terminal message in the same write.

Back pressure: before every batch a worker checks that the client's write buffer is below its
high-water mark; if not, the context is parked on the client, which resumes it once the buffer
drained. So a client that does not read costs at most one write buffer and one batch, never an
unbounded one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feed_cache import (
    FEED_CACHE_BLOCK_INDEX_MASK,
    FEED_CACHE_BLOCK_NUM_TRANSACTIONS,
    FeedCache,
)
from waltz_engine.server.feed_frames import FeedFrames
from waltz_engine.server.store.errors import RetainedStartError

log = logging.getLogger(__name__)

# Transactions one context is sent in one write before the worker turns to the next context
# (fairness): at most the rest of one feed cache block.
FEED_BATCH_NUM_TRANSACTIONS = FEED_CACHE_BLOCK_NUM_TRANSACTIONS

# What serving a context once leaves to do.
_KEEP: Final = 0  # stays with this worker
_DONE: Final = 1  # finished, parked, closed or handed over
_LOAD: Final = 2  # its next frames need headers from storage first


class FeedClient(Protocol):
    """The connection side a feed needs (implemented by the handler's ClientConnection)."""

    @property
    def version(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    # Partitions whose feeds ended on an open connection (their read grant was revoked).
    revoked: set[int]

    def writable(self) -> bool: ...

    def send(self, message: Any) -> None: ...

    def send_frame(self, frame: bytes) -> None: ...

    def send_feed(self, frames: memoryview, terminal: Any | None) -> None:
        """``frames`` (and the encoded ``terminal`` message, if any) in one write."""
        ...

    def park(self, context: FeedContext) -> None: ...

    def disconnect(self) -> None:
        """Close the connection: the client reconnects and remounts its partitions."""
        ...


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
        "frames",
        "realtime_threshold",
        "contexts",
        "handover",
        "total_added",
        "total_removed",
        "_wake",
        "_idle",
    )

    def __init__(
        self,
        name: str,
        realtime: bool,
        source: FeedSource,
        feed_cache: FeedCache,
        frames: FeedFrames,
        realtime_threshold: int,
        handover: Callable[[FeedContext], None],
    ) -> None:
        self.name = name
        self.realtime = realtime
        self.source = source
        self.feed_cache = feed_cache
        # The partition's encoded frames, shared with its other worker.
        self.frames = frames
        self.realtime_threshold = realtime_threshold
        self.contexts: deque[FeedContext] = deque()
        # Where a context goes when it belongs to the other worker (the partition's router).
        self.handover = handover
        self.total_added = 0
        self.total_removed = 0
        self._wake = asyncio.Event()
        # The task waits for a wake-up between rounds (no round is half done).
        self._idle = False

    def add(self, context: FeedContext) -> None:
        self.contexts.append(context)
        self.total_added += 1
        self._wake.set()

    def wake(self) -> None:
        if self.contexts or not self._idle:
            self._wake.set()  # (an idle worker with no context has nothing to do: no task turn)

    def serve_now(self) -> None:
        """A round here and now (a commit's own callback: its feed leaves without a task turn),
        when the task is between rounds; what needs storage, or more rounds, goes to the task."""
        if not self._idle or self._wake.is_set():
            self.wake()
            return
        contexts = self.contexts
        more = False
        for _ in range(len(contexts)):
            context = contexts.popleft()
            outcome = self._serve(context)
            if outcome == _LOAD:
                contexts.appendleft(context)  # the task loads it, first of its next round
                self._wake.set()
                return
            if outcome == _KEEP:
                contexts.append(context)
                more |= context.next_transaction_id <= self.source.high_water_mark
        if more:
            self._wake.set()

    async def run(self) -> None:
        while True:
            self._idle = True
            try:
                await self._wake.wait()
            finally:
                self._idle = False
            self._wake.clear()
            if await self._round():
                self._wake.set()
                await asyncio.sleep(0)  # more to send: let appends and other feeds run first

    async def _round(self) -> bool:
        """Serves every context once; True when some context could go on right away."""
        more = False
        contexts = self.contexts
        for _ in range(len(contexts)):
            context = contexts.popleft()
            outcome = self._serve(context)
            if outcome == _LOAD:
                loaded = await self._load(context)
                outcome = self._serve(context) if loaded is True else _KEEP if loaded is False else _DONE
                if outcome == _LOAD:
                    outcome = _KEEP  # storage did not have it (yet): try again on the next round
            if outcome == _KEEP:
                contexts.append(context)
                more |= context.next_transaction_id <= self.source.high_water_mark
        return more

    def _remove(self) -> None:
        self.total_removed += 1

    def _serve(self, context: FeedContext) -> int:
        """Sends one batch, in one write."""
        client = context.client
        if client.closed or context.req_id.partition_id in client.revoked:
            self._remove()
            return _DONE
        assert not context.finished, context  # a finished context is sent its terminal and dropped
        next_transaction_id = context.next_transaction_id
        high_water_mark = self.source.high_water_mark
        if next_transaction_id <= high_water_mark:
            if not client.writable():
                self._remove()
                client.park(context)
                return _DONE
            last = min(
                context.end_transaction_id, high_water_mark, next_transaction_id | FEED_CACHE_BLOCK_INDEX_MASK
            )
            frames = self.frames.frames(client.version, next_transaction_id, last)
            if frames is None:
                return _LOAD
            context.next_transaction_id = last + 1
            if last >= context.end_transaction_id:  # (``finished``, inline: every commit's feed)
                self._remove()
                client.send_feed(frames, context.terminal)
                return _DONE
            client.send_feed(frames, None)
        lagging = context.lag(high_water_mark) >= self.realtime_threshold
        if lagging == self.realtime:
            self._remove()
            self.handover(context)
            return _DONE
        return _KEEP

    async def _load(self, context: FeedContext) -> bool | None:
        """Reads the headers of the context's next txid up to its block's end from storage, as
        the original prefetches; False when storage did not have the first one; None when it
        never will (retention removed it): the context is dropped.

        The worker serves every context of the partition in one task, so a read that waited for
        good here stalled them all: a feed request from before a client's last mount, at a txid
        the operator's bound let go meanwhile, kept the client's current feed from every commit
        (issue 32, the simulator's seeds 1558, 2056 and bank 214)."""
        transaction_id = context.next_transaction_id
        prefetch = FEED_CACHE_BLOCK_NUM_TRANSACTIONS - (transaction_id & FEED_CACHE_BLOCK_INDEX_MASK)
        try:
            headers = await self.source.record_headers(transaction_id, prefetch)
        except RetainedStartError as e:
            # Nothing to send it, ever: the wire has no "removed" answer to a feed, and its
            # terminal would claim a mount caught up. A client still waiting for it could not be
            # fed anyway; the context of an older mount (the usual case) just goes.
            log.warning(
                "%s: %s: transaction %d was removed by retention (the log starts at %d): "
                "this feed ends unanswered",
                self.name,
                context,
                transaction_id,
                e.retained_start,
            )
            self._remove()
            return None
        if not headers or headers[0].transaction_id != transaction_id:
            log.warning("%s: storage has no header for txid %d", self.name, transaction_id)
            return False
        self.feed_cache.add_all(self.source.partition_id, headers)
        self.frames.add(context.client.version, headers)
        return True

    def num_contexts(self) -> int:
        return len(self.contexts)
