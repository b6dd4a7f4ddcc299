"""The application's unit of work (the original's ``TransactionContext``, §3.1)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from waltz_engine.common import clock

if TYPE_CHECKING:
    from waltz_engine.client.transaction_builder import TransactionBuilder


class TransactionContext(ABC):
    """One transaction the application wants appended: ``execute`` is required, every other
    method has a default (``partition_id``: 0).

    ``execute`` is called once per attempt with a fresh builder carrying the client's
    high-water mark, so a retry sees data at least as new as the transaction that conflicted.
    An attempt is retried only once a server proved it absent (a lock failure, a flush answer,
    a later append of this client in the feed), never while it might still commit.

    The outcome contract: every submitted context ends in exactly one final outcome.

    * ``on_completion(True)``: committed; ``on_application`` follows once applied.
    * ``on_completion(False)``: not in the log, and no retry follows (``execute`` returned
      False, a lock failure with ``client.numTransactionRetryThreads: 0``, a proven-absent
      attempt with no retry left to run: no retry threads, or the client closed).
    * ``on_exception(OutcomeUnknownError)``: the client closed or gave up before a server
      decided the attempt; it may be in the log. The application's ``apply_transaction`` sees
      it if it is: act on the feed, not on this hook (never apply or re-submit it here).
    * ``on_exception(other)``: ``execute`` or the client raised before anything was sent
      (``submit`` raises it too): not in the log.

    With :class:`~waltz_engine.client.WaltzClient` the hooks run on its event loop, with
    :class:`~waltz_engine.client.SyncWaltzClient` on its loop thread (``execute`` on a consumer
    thread); ``execute`` may be a coroutine with the asyncio client. Keep hooks short: they must
    not block or call the client's blocking methods.
    """

    def __init__(self) -> None:
        self.creation_time_ms = clock.wall_ms()

    def partition_id(self, num_partitions: int) -> int:
        """The partition this transaction goes to, in ``0 .. num_partitions - 1`` (default 0).

        Transactions that share locks must go to the same partition: lock scopes are per partition.
        """
        return 0

    @abstractmethod
    def execute(self, builder: TransactionBuilder) -> bool:
        """Fill ``builder``; False means there is nothing to append (→ ``on_completion(False)``)."""

    def on_completion(self, result: bool) -> None:
        """Final: True when committed, False when certainly not in the log; no retry follows."""
        return None

    def on_application(self) -> None:
        """The appended transaction was applied through ``apply_transaction`` (after on_completion)."""
        return None

    def on_exception(self, exception: BaseException) -> None:
        """Final: OutcomeUnknownError (maybe committed), or an error before anything was sent."""
        return None

    def on_lock_failure(self) -> None:
        """The server rejected this attempt on a lock; a retry follows once the client caught up
        (or, with no retry threads, ``on_completion(False)``)."""
        return None
