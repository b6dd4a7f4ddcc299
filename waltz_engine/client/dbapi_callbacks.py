"""Exactly-once application on a DB-API database (the original's ``AbstractClientCallbacksForJDBC``).

The client high-water mark of every partition is a row of a table in the application's own
database, and it moves in the *same* database transaction as the application's changes::

    UPDATE <table> SET high_water_mark = high_water_mark + 1
     WHERE partition_id = ? AND high_water_mark = ?          -- txid - 1
    ... the application's statements (DbApiClientCallbacks.apply) ...
    COMMIT

Either both commit or neither does. A process that dies between applying and committing
left nothing behind, so after a restart the client mounts from the stored high-water mark
and the transaction is applied once; one that dies after committing is not fed it again.
Several instances may share one database (each instance's client feeds every transaction):
the guarded UPDATE lets exactly one apply it and the others skip it.

Subclass and implement :meth:`DbApiClientCallbacks.apply`; it gets a cursor in the open
database transaction and must not commit or roll back (the helper does). Use it with
:class:`SyncWaltzClient` (callbacks then run on consumer threads, where blocking database
calls and ``transaction.get_data()`` belong)::

    class Callbacks(DbApiClientCallbacks):
        def apply(self, transaction: Transaction, cursor: DbApiCursor) -> None:
            cursor.execute("INSERT INTO notes(text) VALUES (?)", (transaction.get_data().decode(),))

    callbacks = Callbacks(lambda: sqlite3.connect("app.sqlite", check_same_thread=False))
    client = SyncWaltzClient(callbacks, config)

The connection factory should give serializable transactions (SQLite's are); each consumer
thread gets its own connection from it, and :meth:`DbApiClientCallbacks.close` closes them all
from the caller's thread (for sqlite3: ``sqlite3.connect(path, check_same_thread=False)``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from waltz_engine.client.callbacks import WaltzClientCallbacks
from waltz_engine.client.errors import WaltzClientError
from waltz_engine.client.transaction import Transaction

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TABLE = "waltz_client_high_water_marks"
NO_HIGH_WATER_MARK = -1
QMARK = "?"  # sqlite3's placeholder; "%s" for psycopg, MySQLdb and friends
# The original retries SQL errors with a backoff doubling from 10 ms up to 10 s. We give up after
# MAX_ATTEMPTS and raise instead: the client then reconnects and feeds the transaction again, so
# the retrying goes on without one call blocking its consumer thread forever.
INITIAL_RETRY_BACKOFF_S = 0.010
MAX_RETRY_BACKOFF_S = 10.0
DEFAULT_MAX_ATTEMPTS = 10
# SQLite reports a write lock held by another connection as OperationalError ("database is locked"),
# and two instances sharing a database creating the same partition's row as IntegrityError.
DEFAULT_RETRIABLE_ERRORS: tuple[type[Exception], ...] = (sqlite3.OperationalError, sqlite3.IntegrityError)


class DbApiCursor(Protocol):
    """The part of a PEP 249 cursor the helper and ``apply`` use."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, operation: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...

    def close(self) -> None: ...


class DbApiConnection(Protocol):
    """The part of a PEP 249 connection the helper uses."""

    def cursor(self) -> DbApiCursor: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class HighWaterMarkError(WaltzClientError):
    """The stored high-water mark is behind the transaction fed: a transaction would be skipped."""


class DbApiClientCallbacks(WaltzClientCallbacks):
    """Client callbacks that keep the high-water marks beside the application's state."""

    def __init__(
        self,
        connect: Callable[[], DbApiConnection],
        *,
        table: str = DEFAULT_TABLE,
        placeholder: str = QMARK,
        retriable_errors: tuple[type[Exception], ...] = DEFAULT_RETRIABLE_ERRORS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        assert table.replace("_", "").isalnum(), f"not a plain table name: {table!r}"
        assert max_attempts >= 1
        self._connect = connect
        self._retriable_errors = retriable_errors
        self._max_attempts = max_attempts
        p = placeholder
        self._select_sql = f"SELECT high_water_mark FROM {table} WHERE partition_id = {p}"
        self._insert_sql = f"INSERT INTO {table} (partition_id, high_water_mark) VALUES ({p}, {p})"
        self._advance_sql = (
            f"UPDATE {table} SET high_water_mark = high_water_mark + 1 "
            f"WHERE partition_id = {p} AND high_water_mark = {p}"
        )
        self._local = threading.local()
        self._connections: list[DbApiConnection] = []
        self._lock = threading.Lock()
        self._applied = threading.Condition(self._lock)
        self._high_water_marks: dict[int, int] = {}
        self._run_in_transaction(
            lambda cursor: cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {table} "
                "(partition_id INTEGER PRIMARY KEY, high_water_mark BIGINT NOT NULL)"
            )
        )

    # -- what the application implements -----------------------------------------------------

    @abstractmethod
    def apply(self, transaction: Transaction, cursor: DbApiCursor) -> None:
        """Apply ``transaction`` with ``cursor``, inside the database transaction that advances the mark.

        Must be deterministic in the log's contents (every instance applies every transaction)
        and must not commit or roll back. Raising rolls everything back; the client feeds the
        transaction again (after ``uncaught_exception``).
        """

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        log.error("partition %d: transaction %d not applied: %s", partition_id, transaction_id, exception)

    # -- WaltzClientCallbacks ----------------------------------------------------------------

    def get_client_high_water_mark(self, partition_id: int) -> int:
        high_water_mark = self._run_in_transaction(lambda cursor: self._read_or_create(cursor, partition_id))
        self._note(partition_id, high_water_mark)
        return high_water_mark

    def apply_transaction(self, transaction: Transaction) -> None:
        partition_id = transaction.partition_id
        high_water_mark = self._run_in_transaction(lambda cursor: self._apply_once(cursor, transaction))
        self._note(partition_id, high_water_mark)

    # -- for the application -----------------------------------------------------------------

    def high_water_mark(self, partition_id: int) -> int:
        """The last transaction of ``partition_id`` applied to the database, as this instance knows it."""
        with self._lock:
            return self._high_water_marks.get(partition_id, NO_HIGH_WATER_MARK)

    def wait_for_high_water_mark(self, partition_id: int, transaction_id: int, timeout_s: float) -> bool:
        """Wait until ``transaction_id`` of ``partition_id`` is applied; False if ``timeout_s`` ran out."""
        with self._applied:
            return self._applied.wait_for(
                lambda: self._high_water_marks.get(partition_id, NO_HIGH_WATER_MARK) >= transaction_id,
                timeout_s,
            )

    def close(self) -> None:
        """Close every connection this helper opened (uncommitted work is rolled back)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    # -- internals ---------------------------------------------------------------------------

    def _read_or_create(self, cursor: DbApiCursor, partition_id: int) -> int:
        cursor.execute(self._select_sql, (partition_id,))
        row = cursor.fetchone()
        if row is not None:
            return int(row[0])
        # Another instance sharing the database may insert it first: the retry then reads its row.
        cursor.execute(self._insert_sql, (partition_id, NO_HIGH_WATER_MARK))
        return NO_HIGH_WATER_MARK

    def _apply_once(self, cursor: DbApiCursor, transaction: Transaction) -> int:
        partition_id, transaction_id = transaction.partition_id, transaction.transaction_id
        cursor.execute(self._advance_sql, (partition_id, transaction_id - 1))
        if cursor.rowcount == 1:
            self.apply(transaction, cursor)
            return transaction_id
        cursor.execute(self._select_sql, (partition_id,))
        row = cursor.fetchone()
        stored = NO_HIGH_WATER_MARK if row is None else int(row[0])
        if stored < transaction_id:
            raise HighWaterMarkError(
                f"partition {partition_id}: the database's high-water mark is {stored}, "
                f"so transaction {transaction_id} cannot be applied next"
            )
        return stored  # another instance sharing this database applied it already

    def _run_in_transaction(self, work: Callable[[DbApiCursor], T]) -> T:
        backoff_s = INITIAL_RETRY_BACKOFF_S
        for attempt in range(1, self._max_attempts + 1):
            connection = self._connection()
            cursor = connection.cursor()
            try:
                result = work(cursor)
                connection.commit()
                return result
            except self._retriable_errors as e:
                connection.rollback()
                if attempt == self._max_attempts:
                    raise
                log.warning("database error (attempt %d, retrying in %.3f s): %s", attempt, backoff_s, e)
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_RETRY_BACKOFF_S)
            except BaseException:
                connection.rollback()
                raise
            finally:
                cursor.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _connection(self) -> DbApiConnection:
        connection: DbApiConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._connect()
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _note(self, partition_id: int, high_water_mark: int) -> None:
        with self._applied:
            if high_water_mark > self._high_water_marks.get(partition_id, NO_HIGH_WATER_MARK):
                self._high_water_marks[partition_id] = high_water_mark
                self._applied.notify_all()
