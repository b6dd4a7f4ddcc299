"""Errors of the store layer (the original's ``SV/store/exception``)."""

from __future__ import annotations

from waltz_engine.common.errors import WaltzError


class StoreError(WaltzError):
    """A store operation failed; the callers in this package retry it with backoff."""


class GenerationMismatchError(StoreError):
    """The request's generation is not the partition's, or a newer owner holds the partition in ZK."""


class SessionClosedError(StoreError):
    """The store session closed under the caller; a new session takes over."""


class RecoveryFailedError(StoreError):
    """Recovery of a new store session failed or was aborted (the session closed)."""


class MetadataUnavailableError(StoreError):
    """ZooKeeper could not be read or written (connection lost, session expired); retried."""


class StorePartitionClosedError(StoreError):
    """The store partition (or the whole store) was closed."""


class RetainedStartError(StoreError):
    """A read asked for a transaction that retention removed; the log now starts later."""

    def __init__(self, message: str, retained_start: int) -> None:
        super().__init__(message)
        self.retained_start = retained_start


class AppendOutcomeUnknownError(StoreError):
    """An append of a failed session whose outcome cannot be learnt, for good: the record at
    its txid was removed (by retention) before the successor read it back. Final: nothing of it
    can commit later (the txid lies below the successor's low-water mark)."""

    def __init__(self, message: str, transaction_id: int) -> None:
        super().__init__(message)
        self.transaction_id = transaction_id
