"""The application's unit of work (the original's ``TransactionContext``, §3.1)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from waltz_engine.common import clock

if TYPE_CHECKING:
    from waltz_engine.client.transaction_builder import TransactionBuilder


class TransactionContext(ABC):
    """Builds one transaction; the client re-executes it until it is appended or given up.

    ``execute`` is called once per attempt with a fresh builder carrying the client's
    high-water mark, so a retry sees data at least as new as the transaction that conflicted.
    """

    def __init__(self) -> None:
        self.creation_time_ms = clock.wall_ms()

    @abstractmethod
    def partition_id(self, num_partitions: int) -> int:
        """The partition this transaction goes to, in ``0 .. num_partitions - 1``."""

    @abstractmethod
    def execute(self, builder: TransactionBuilder) -> bool:
        """Fill ``builder``; False means there is nothing to append (→ ``on_completion(False)``)."""

    def on_completion(self, result: bool) -> None:
        """Final: True when appended, False when ``execute`` declined; no retry follows."""
        return None

    def on_application(self) -> None:
        """The appended transaction was applied through ``apply_transaction`` (after on_completion)."""
        return None

    def on_exception(self, exception: BaseException) -> None:
        """Final: ``execute`` or the client raised; no retry follows."""
        return None

    def on_lock_failure(self) -> None:
        """The server rejected this attempt on a lock; a retry follows once the client caught up."""
        return None
