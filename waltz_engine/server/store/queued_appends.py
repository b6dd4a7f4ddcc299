"""What a store session's queue holds: an append with its future (:class:`StoreAppendRequest`),
or one taken without waiting whose decision goes straight to a callback (:class:`LoneAppend`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from waltz_engine.common.reqid import ReqId

FAILED_TRANSACTION_ID = -1


class AppendFuture(asyncio.Future[int]):
    """An append's outcome: a committed txid, or -1 when it definitely failed.

    A callback given to :meth:`when_decided` runs in the very call that decides a batch's vote
    (:meth:`StoreSession._resolve_in_flight`), not a loop turn later as a done callback does:
    the commit's feed leaves from there. Other outcomes (recovery's, a closing partition's) run
    it a turn later, as before.
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self.last_of_batch = True
        self._decided_callbacks: list[Callable[[asyncio.Future[int]], None]] = []

    def when_decided(self, callback: Callable[[asyncio.Future[int]], None]) -> None:
        if self.done():
            self.get_loop().call_soon(callback, self)
        else:
            self._decided_callbacks.append(callback)

    def decide(self, transaction_id: int, eager: bool, last_of_batch: bool = True) -> None:
        if self.done():
            return
        # False while later appends of the same batch are still to be decided in this call: work
        # done once per batch (the feed) waits for the last one.
        self.last_of_batch = last_of_batch
        self.set_result(transaction_id)
        self._run_decided(eager)

    def fail(self, error: BaseException) -> None:
        if not self.done():
            self.set_exception(error)
            self._run_decided(eager=False)

    def _run_decided(self, eager: bool) -> None:
        callbacks, self._decided_callbacks = self._decided_callbacks, []
        loop = self.get_loop()
        for callback in callbacks:
            if not eager:
                loop.call_soon(callback, self)
                continue
            try:
                callback(self)
            except Exception as e:  # as a done callback's error: reported, the batch goes on
                loop.call_exception_handler(
                    {"message": "append decision callback failed", "exception": e, "future": self}
                )


class StoreAppendRequest(NamedTuple):
    req_id: ReqId
    header: int
    data: bytes
    checksum: int
    future: asyncio.Future[int]  # an AppendFuture from the store partition

    def commit(self, transaction_id: int, eager: bool = False, last_of_batch: bool = True) -> None:
        future = self.future
        if isinstance(future, AppendFuture):
            future.decide(transaction_id, eager, last_of_batch)
        elif not future.done():
            future.set_result(transaction_id)

    def fail(self, error: BaseException) -> None:
        future = self.future
        if isinstance(future, AppendFuture):
            future.fail(error)
        elif not future.done():
            future.set_exception(error)


# An append's decision, ``(transaction_id, error, last_of_batch)`` (see :class:`LoneAppend`).
AppendDecision = Callable[[int, BaseException | None, bool], None]


class LoneAppend:
    """An append taken without waiting (``StorePartition.append_lone``): its outcome goes to
    ``on_decided(transaction_id, error, last_of_batch)`` (error None: a txid, or -1 when it
    definitely failed), once, with no future between. Eagerly in the call that decides the
    batch's vote, as :class:`AppendFuture`'s ``when_decided``; a loop turn later otherwise
    (recovery's outcome, a closing partition's). Queued and resolved as a
    :class:`StoreAppendRequest` is, by the same session code."""

    __slots__ = ("req_id", "header", "data", "checksum", "_on_decided")

    def __init__(
        self,
        req_id: ReqId,
        header: int,
        data: bytes,
        checksum: int,
        on_decided: AppendDecision,
    ) -> None:
        self.req_id = req_id
        self.header = header
        self.data = data
        self.checksum = checksum
        self._on_decided: AppendDecision | None = on_decided

    def commit(self, transaction_id: int, eager: bool = False, last_of_batch: bool = True) -> None:
        on_decided, self._on_decided = self._on_decided, None
        if on_decided is None:
            return
        if not eager:
            asyncio.get_running_loop().call_soon(on_decided, transaction_id, None, True)
            return
        try:
            on_decided(transaction_id, None, last_of_batch)
        except Exception as e:  # as a done callback's error: reported, the batch goes on
            asyncio.get_running_loop().call_exception_handler(
                {"message": "append decision callback failed", "exception": e}
            )

    def fail(self, error: BaseException) -> None:
        on_decided, self._on_decided = self._on_decided, None
        if on_decided is not None:
            asyncio.get_running_loop().call_soon(on_decided, FAILED_TRANSACTION_ID, error, True)


# A store session's queue entry.
QueuedAppend = StoreAppendRequest | LoneAppend
