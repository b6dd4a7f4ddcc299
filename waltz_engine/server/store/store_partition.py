"""The store's view of one partition (``StorePartitionImpl``): appends, flush, reads, with retries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from waltz_engine.common.backoff import Backoff
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.store.config import StoreConfig
from waltz_engine.server.store.errors import (
    GenerationMismatchError,
    RetainedStartError,
    SessionClosedError,
    StoreError,
    StorePartitionClosedError,
)
from waltz_engine.server.store.queued_appends import (
    AppendDecision,
    AppendFuture,
    LoneAppend,
    StoreAppendRequest,
)
from waltz_engine.server.store.store_session import StoreSession
from waltz_engine.server.store.store_session_manager import StoreSessionManager

log = logging.getLogger(__name__)

T = TypeVar("T")


class StorePartition:
    def __init__(self, manager: StoreSessionManager, config: StoreConfig) -> None:
        self.partition_id = manager.partition_id
        self._manager = manager
        self._config = config
        self._running = True
        self._reopen: asyncio.Task[None] | None = None
        # A session that fails right after it opened (a replica that answers every recovery
        # with an error) is reopened with a growing pause, not in a loop.
        self._reopen_backoff = Backoff(config.initial_retry_interval_ms, config.max_retry_interval_ms)
        self._last_reopen_s: float | None = None
        manager.on_session_failure = self._reopen_soon

    def _reopen_soon(self) -> None:
        """A session failed: open its successor now (undecided appends wait for it; health
        reflects it), not on the next use."""
        if self._running and (self._reopen is None or self._reopen.done()):
            self._reopen = asyncio.create_task(
                self._reopen_quietly(), name=f"StoreReopen-{self.partition_id}"
            )

    async def _reopen_quietly(self) -> None:
        loop = asyncio.get_running_loop()
        last, self._last_reopen_s = self._last_reopen_s, loop.time()
        if last is not None and loop.time() - last < self._config.max_retry_interval_ms / 1000:
            await self._reopen_backoff.wait()
        else:
            self._reopen_backoff.reset()
        try:
            await self.ensure_open()
        except (GenerationMismatchError, StorePartitionClosedError) as e:
            log.warning("partition %d: no new store session: %s", self.partition_id, e)

    async def set_generation(self, generation: int) -> None:
        self._manager.set_generation(generation)

    @property
    def generation(self) -> int:
        return self._manager.generation

    @property
    def healthy(self) -> bool:
        session = self._manager.current_session
        return self._running and self._manager.healthy and not (session is not None and session.failed)

    @property
    def high_water_mark(self) -> int:
        session = self._manager.current_session
        return session.high_water_mark if session is not None else self._manager.last_high_water_mark

    @property
    def low_water_mark(self) -> int:
        """The high-water mark the current session's recovery resolved: every txid to it committed."""
        session = self._manager.current_session
        return session.low_water_mark if session is not None else self._manager.last_high_water_mark

    @property
    def num_pending_appends(self) -> int:
        session = self._manager.current_session
        return session.num_pending_appends if session is not None else 0

    def append_lone(
        self,
        req_id: ReqId,
        header: int,
        data: bytes,
        checksum: int,
        on_decided: AppendDecision,
    ) -> bool:
        """:meth:`append` when it needs no waiting (the current session serves and has room, no
        checkpoint is due), its outcome going to ``on_decided`` (see :class:`LoneAppend`) with
        no future; False: nothing was done, use :meth:`append`."""
        if not self._running:
            return False
        session = self._manager.serving_session(req_id.generation)
        if session is None:
            return False
        if session.high_water_mark - session.low_water_mark >= self._config.checkpoint_interval:
            return False  # the checkpoint opens a new session: append() does it
        return session.append_now(LoneAppend(req_id, header, data, checksum, on_decided))

    async def append(self, req_id: ReqId, header: int, data: bytes, checksum: int) -> asyncio.Future[int]:
        """Register an append; its future gets the committed txid, or -1 when it definitely failed."""
        future = AppendFuture(loop=asyncio.get_running_loop())
        request = StoreAppendRequest(req_id, header, data, checksum, future)

        async def attempt() -> asyncio.Future[int] | None:
            session = await self._manager.get_store_session(req_id.generation)
            if session.high_water_mark - session.low_water_mark >= self._config.checkpoint_interval:
                # A new session persists a new low-water mark on every storage (the checkpoint).
                await session.flush()
                session.close()
                return None
            await session.append(request)
            return future

        return await self._retrying(attempt, retry_on_none=True)

    async def flush(self) -> int:
        """Wait until every registered append is resolved; the high-water mark."""
        return await self._with_session(lambda session: session.flush())

    async def ensure_open(self) -> None:
        await self._with_session(lambda session: _done())

    async def record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        return await self._with_session(lambda session: session.record_headers(transaction_id, max_records))

    async def record(self, transaction_id: int) -> Record | None:
        return await self._with_session(lambda session: session.record(transaction_id))

    async def committed_records(self, transaction_id: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` committed records from ``transaction_id``: one RECORD_LIST."""
        return await self._with_session(
            lambda session: session.committed_records(transaction_id, max_records)
        )

    async def _with_session(self, call: Callable[[StoreSession], Awaitable[T]]) -> T:
        async def attempt() -> T:
            return await call(await self._manager.get_store_session())

        return await self._retrying(attempt)

    async def _retrying(self, attempt: Callable[[], Awaitable[T | None]], retry_on_none: bool = False) -> T:
        backoff: Backoff | None = None  # made at the first retry: an append rarely needs one
        while self._running:
            try:
                result = await attempt()
                if result is not None or not retry_on_none:
                    return result  # type: ignore[return-value]
                continue  # checkpoint: the next attempt opens a new session at once
            except (GenerationMismatchError, StorePartitionClosedError, RetainedStartError):
                # Final answers: a retry would get the same one (a read below the retained start
                # was retried for good, and the feed or session opening that waited on it stalled
                # the partition: issue 32's seeds 1558, 2056 and bank 214).
                raise
            except SessionClosedError:
                pass
            except StoreError as e:
                log.warning("partition %d: %s; retrying", self.partition_id, e)
            if backoff is None:
                backoff = Backoff(self._config.initial_retry_interval_ms, self._config.max_retry_interval_ms)
            await backoff.wait()
        raise StorePartitionClosedError(f"partition {self.partition_id} is closed")

    def status(self) -> dict[str, object]:
        session = self._manager.current_session
        return {
            "partition_id": self.partition_id,
            "generation": self._manager.generation,
            "healthy": self.healthy,
            "high_water_mark": self.high_water_mark,
            "session": session.status() if session is not None else None,
        }

    async def close(self) -> None:
        if self._running:
            self._running = False
            if self._reopen is not None:
                self._reopen.cancel()
            await self._manager.close(StorePartitionClosedError(f"partition {self.partition_id} closed"))


async def _done() -> None:
    return None
