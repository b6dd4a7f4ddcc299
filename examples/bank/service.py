"""The bank-account service: Waltz decides every operation, SQLite holds the balances.

An operation is a transaction in the Waltz log; a balance is whatever the log's operations
add up to. Every instance of the service applies the whole log to its own SQLite file, so
several instances serve the same accounts and agree on every balance.

* Every operation on an account takes the account's write lock ``("account", id)``.
* A withdrawal reads the balance in ``execute``. The server rejects it if another operation
  on the account was committed after the high-water mark that balance was read at; the
  client then re-executes it on the newer balance. So no instance ever overdraws, however
  many withdraw concurrently.
* The balances and the client high-water marks are committed in one SQLite transaction
  (:class:`DbApiClientCallbacks`): a restart never applies an operation twice or skips one.
* The log may be shared with other applications (``waltz append`` writes header 0). Every bank
  operation carries the header :data:`BANK_HEADER`; a transaction with any other header is not
  the bank's and is skipped, unread. Skipping still moves the high-water mark in its SQLite
  transaction, exactly as applying does, so a skipped transaction is not fed again either.
* Outcomes follow the client's contract (README, "The outcome contract"). ``on_completion(False)``
  means the operation is not in the log: declined. ``OutcomeUnknownError`` (the client closed or
  gave up before a server decided it) means it may be: the bank never submits it again, which
  could apply it twice; the ledger shows it once the feed brings it (``catch_up``, ``history``).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_engine.client import (
    SyncWaltzClient,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientConfig,
    WaltzClientError,
)
from waltz_engine.client.dbapi_callbacks import DbApiClientCallbacks, DbApiConnection, DbApiCursor

log = logging.getLogger(__name__)

# The header of every bank transaction ("BANK" in ASCII, an int32): any other header is another
# application's transaction in a shared log, and the bank skips it.
BANK_HEADER = 0x42414E4B
# What an operation does; its data names it, with the account and the amount.
DEPOSIT = 1
WITHDRAW = 2
OPERATION_NAMES = {DEPOSIT: "deposit", WITHDRAW: "withdraw"}
OPERATION_KINDS = {name: kind for kind, name in OPERATION_NAMES.items()}

ACCOUNT_LOCK = "account"
# Another connection (a consumer thread of this instance) may hold SQLite's write lock briefly.
SQLITE_BUSY_TIMEOUT_S = 30.0
OUTCOME_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    # One row per applied operation: the account's history, and a check that nothing is applied twice.
    "CREATE TABLE IF NOT EXISTS ledger ("
    " partition_id INTEGER NOT NULL, transaction_id INTEGER NOT NULL,"
    " account INTEGER NOT NULL, amount INTEGER NOT NULL, balance INTEGER NOT NULL)",
)


class InsufficientFunds(Exception):
    """The withdrawal was declined: the balance (at the time it was decided) is too low."""


@dataclass(frozen=True)
class Operation:
    kind: int
    account: int
    amount: int

    def __post_init__(self) -> None:
        if self.kind not in OPERATION_NAMES:
            raise ValueError(f"unknown operation {self.kind}")
        if self.amount <= 0:
            raise ValueError(f"the amount must be positive, got {self.amount}")

    def encode(self) -> bytes:
        fields = {"operation": OPERATION_NAMES[self.kind], "account": self.account, "amount": self.amount}
        return json.dumps(fields).encode()

    @classmethod
    def decode(cls, data: bytes) -> Operation:
        """The operation of a transaction with :data:`BANK_HEADER` (another header: not the bank's)."""
        fields = json.loads(data)
        return cls(OPERATION_KINDS[fields["operation"]], int(fields["account"]), int(fields["amount"]))

    @property
    def delta(self) -> int:
        return self.amount if self.kind == DEPOSIT else -self.amount


def open_database(path: Path | str) -> sqlite3.Connection:
    # WAL: balance reads do not wait for the consumer threads' writes. check_same_thread off:
    # the callbacks helper closes its per-thread connections from the thread that closes the bank.
    connection = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


class BankCallbacks(DbApiClientCallbacks):
    """Applies each operation of the log to ``accounts`` and ``ledger``, exactly once.

    Transactions of other applications (a header other than :data:`BANK_HEADER`) are skipped
    in ``apply``: it leaves the tables alone, and the database transaction around it records the
    transaction id as the partition's high-water mark just as for an applied operation, so a
    restarted instance is not fed it again. (Decoding it instead raised, rolled back, and had the
    client feed it again at once, forever.)
    """

    def __init__(self, connect: Callable[[], DbApiConnection], **options: Any) -> None:
        super().__init__(connect, **options)
        self._skipped_lock = threading.Lock()
        self._skipped = 0
        self._attempt = threading.local()  # per consumer thread: did apply skip the transaction?

    @property
    def skipped(self) -> int:
        """Transactions of other applications this instance skipped (recorded in its database)."""
        with self._skipped_lock:
            return self._skipped

    def apply_transaction(self, transaction: Transaction) -> None:
        self._attempt.skipped = False
        super().apply_transaction(transaction)  # apply in a SQLite transaction; returns once committed
        # Counted after the commit: not for a rolled-back attempt, nor when another instance
        # sharing the database recorded it first (apply is not called then).
        if self._attempt.skipped:
            with self._skipped_lock:
                self._skipped += 1
            log.debug(
                "partition %d: transaction %d skipped: header %d is not the bank's",
                transaction.partition_id,
                transaction.transaction_id,
                transaction.header,
            )

    def apply(self, transaction: Transaction, cursor: DbApiCursor) -> None:
        if transaction.header != BANK_HEADER:
            self._attempt.skipped = True
            return  # not the bank's: only the high-water mark moves, and its data is never fetched
        self._attempt.skipped = False
        operation = Operation.decode(transaction.get_data())
        cursor.execute(
            "INSERT INTO accounts (id, balance) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET balance = balance + excluded.balance",
            (operation.account, operation.delta),
        )
        cursor.execute("SELECT balance FROM accounts WHERE id = ?", (operation.account,))
        (balance,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?)",
            (
                transaction.partition_id,
                transaction.transaction_id,
                operation.account,
                operation.delta,
                balance,
            ),
        )


class AccountTransaction(TransactionContext):
    """One deposit or withdrawal; ``outcome`` is True once applied here, False if declined."""

    def __init__(self, bank: Bank, operation: Operation) -> None:
        super().__init__()
        self.bank = bank
        self.operation = operation
        self.outcome: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def partition_id(self, num_partitions: int) -> int:
        # All operations of an account go to one partition: its lock and order live there.
        return self.operation.account % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        operation = self.operation
        # Read at (or after) the builder's high-water mark: the server checks the lock against it.
        if operation.kind == WITHDRAW and self.bank.balance(operation.account) < operation.amount:
            return False  # declined: nothing is written, on_completion(False) follows
        builder.set_header(BANK_HEADER)
        builder.set_transaction_data(operation.encode())
        builder.set_write_locks([(ACCOUNT_LOCK, operation.account)])
        return True

    def on_completion(self, result: bool) -> None:
        if not result:
            self._settle(False)
        # True: wait for on_application, so that the caller then reads its own write.

    def on_application(self) -> None:
        self._settle(True)

    def on_exception(self, exception: BaseException) -> None:
        # OutcomeUnknownError: maybe committed. Never re-submitted here (a second copy would be a
        # second operation); the caller learns it is unknown, the feed settles the balance.
        if not self.outcome.done():
            self.outcome.set_exception(exception)

    def _settle(self, applied: bool) -> None:
        if not self.outcome.done():
            self.outcome.set_result(applied)

    def on_lock_failure(self) -> None:
        self.bank.lock_failures += 1  # a retry on the newer balance follows


class Bank:
    """One instance of the service: a Waltz client and its own SQLite file."""

    def __init__(self, config: WaltzClientConfig, database: Path | str) -> None:
        self.database = Path(database)
        self.lock_failures = 0
        with closing(open_database(self.database)) as db, db:
            for statement in SCHEMA:
                db.execute(statement)
        self.callbacks = BankCallbacks(lambda: open_database(self.database))
        try:
            self.client = SyncWaltzClient(self.callbacks, config)
        except BaseException:
            self.callbacks.close()
            raise

    def submit(self, kind: int, account: int, amount: int) -> concurrent.futures.Future[bool]:
        """Send one operation; the future says whether it was applied (True) or declined (False),
        or raises OutcomeUnknownError when it may or may not be in the log (see the module)."""
        context = AccountTransaction(self, Operation(kind, account, amount))
        self.client.submit(context)
        return context.outcome

    def deposit(self, account: int, amount: int) -> int:
        """Deposit and return the new balance."""
        self.submit(DEPOSIT, account, amount).result(OUTCOME_TIMEOUT_S)
        return self.balance(account)

    def withdraw(self, account: int, amount: int) -> int:
        """Withdraw and return the new balance; InsufficientFunds if the balance is too low."""
        if not self.submit(WITHDRAW, account, amount).result(OUTCOME_TIMEOUT_S):
            raise InsufficientFunds(f"account {account}: balance {self.balance(account)} < {amount}")
        return self.balance(account)

    def balance(self, account: int) -> int:
        """The balance as this instance has applied the log so far (see :meth:`catch_up`)."""
        with closing(open_database(self.database)) as db:
            row = db.execute("SELECT balance FROM accounts WHERE id = ?", (account,)).fetchone()
        return 0 if row is None else int(row[0])

    @property
    def skipped_transactions(self) -> int:
        """Transactions of other applications (not :data:`BANK_HEADER`) this instance skipped."""
        return self.callbacks.skipped

    def catch_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Wait until this instance has applied everything the log held when called."""
        for partition_id in range(self.client.num_partitions):
            target = self.client.high_water_mark(partition_id)
            if not self.callbacks.wait_for_high_water_mark(partition_id, target, timeout_s):
                raise TimeoutError(
                    f"partition {partition_id}: transaction {target} not applied in {timeout_s} s"
                )

    def history(self, account: int) -> list[tuple[int, int]]:
        """(amount, balance after) of every operation on ``account``, in order."""
        with closing(open_database(self.database)) as db:
            rows = db.execute(
                "SELECT amount, balance FROM ledger WHERE account = ? ORDER BY transaction_id", (account,)
            ).fetchall()
        return [(int(amount), int(balance)) for amount, balance in rows]

    def close(self) -> None:
        """Have every operation sent decided (bounded: ``flush_timeout_ms``), then close; one
        still undecided ends with OutcomeUnknownError."""
        try:
            try:
                self.client.flush()
            except WaltzClientError as e:
                log.warning("closing with operations undecided: %s", e)
            self.client.close()
        finally:
            self.callbacks.close()

    def __enter__(self) -> Bank:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
