"""How the client talks to the application (the original's ``WaltzClientCallbacks``, §3.1)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from waltz_engine.client.transaction import Transaction

log = logging.getLogger(__name__)


class WaltzClientCallbacks(ABC):
    """Implemented by the application: ``get_client_high_water_mark`` and ``apply_transaction``
    are required, ``uncaught_exception`` is optional (it logs the error).

    With :class:`~waltz_engine.client.WaltzClient` they run on its event loop and may be plain
    methods or coroutines (a coroutine's data reads: ``await transaction.data()``). With
    :class:`~waltz_engine.client.SyncWaltzClient` they run on its consumer threads
    (``client.numConsumerThreads``) and may block, e.g. on ``transaction.get_data()``.

    The feed is the truth of the outcome contract: every committed transaction reaches
    ``apply_transaction`` once, those of contexts that ended with ``OutcomeUnknownError`` too
    (if they committed), and none that a context was told is not committed.
    """

    @abstractmethod
    def get_client_high_water_mark(self, partition_id: int) -> int | Awaitable[int]:
        """The id of the last transaction of ``partition_id`` the application applied (-1: none)."""

    @abstractmethod
    def apply_transaction(self, transaction: Transaction) -> None | Awaitable[None]:
        """Apply one committed transaction; called strictly in transaction id order per partition.

        The application must store ``transaction.transaction_id`` as its new high-water mark
        atomically with the effects. Raising makes the client reconnect (after a backoff that
        grows with each try) and feed it again; after ``client.config.MAX_APPLICATION_ATTEMPTS``
        tries of the same transaction (``WaltzClientConfig.max_application_attempts``) the client
        stops the partition (see :meth:`uncaught_exception`).
        """

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        """``apply_transaction`` raised ``exception`` on ``transaction_id`` of ``partition_id``.

        Called once per failed try. On the last allowed try ``exception`` is instead a
        :class:`~waltz_engine.client.errors.PartitionStoppedError` (the application's exception
        is its ``__cause__``): the client has stopped the partition (no feed, no appends; pending
        ones end with OutcomeUnknownError) and logged one error line saying so. By default the
        error is logged.

        Also called, once, with an :class:`~waltz_engine.client.errors.AuthorizationError` (and
        the partition's high-water mark as ``transaction_id``) when the server's ACLs refuse this
        client the partition's mount or feed, e.g. after its read grant was revoked: the feed of
        the partition has ended, and stays ended in this client (a later grant is seen by a client
        created after it).
        """
        from waltz_engine.client.errors import AuthorizationError

        if isinstance(exception, AuthorizationError):
            log.error("partition %d: the feed ended: %s", partition_id, exception)
            return
        log.error(
            "apply_transaction failed on transaction %d of partition %d: %s",
            transaction_id,
            partition_id,
            exception,
        )
