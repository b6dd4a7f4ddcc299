"""DbApiClientCallbacks: the high-water mark and the application's state commit together.

A "crash" is a commit that raises and every later commit of that process failing too; the
process's connections are then closed (what dying does to uncommitted work) and a second
instance starts on the same database file.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext

from waltz_engine.client import SyncWaltzClient, Transaction, WaltzClientConfig
from waltz_engine.client.dbapi_callbacks import DbApiClientCallbacks, DbApiConnection, DbApiCursor
from waltz_engine.client.pytest_plugin import WaltzMockHarness

NUM_TRANSACTIONS = 12
CRASH_AT_TRANSACTION_ID = 5
WAIT_S = 30.0
SQLITE_BUSY_TIMEOUT_S = 30.0
BEFORE_COMMIT = "before-commit"
AFTER_COMMIT = "after-commit"


class SimulatedCrash(Exception):
    pass


class Crash:
    """When the process dies: at the commit of one transaction, before or after it is durable."""

    def __init__(self, transaction_id: int, when: str) -> None:
        self.transaction_id = transaction_id
        self.when = when
        self.applying: int | None = None
        self.dead = threading.Event()


class CrashingConnection:
    """A sqlite3 connection whose commits fail from the crash on (a DbApiConnection)."""

    def __init__(self, inner: sqlite3.Connection, crash: Crash) -> None:
        self._inner = inner
        self._crash = crash

    def cursor(self) -> DbApiCursor:
        return self._inner.cursor()

    def commit(self) -> None:
        crash = self._crash
        if crash.dead.is_set():
            raise SimulatedCrash("the process is dead")
        if crash.applying == crash.transaction_id:
            if crash.when == AFTER_COMMIT:
                self._inner.commit()
            crash.dead.set()
            raise SimulatedCrash(f"died {crash.when} of transaction {crash.transaction_id}")
        self._inner.commit()

    def rollback(self) -> None:
        self._inner.rollback()

    def close(self) -> None:
        self._inner.close()


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False)


class NotesCallbacks(DbApiClientCallbacks):
    """Stores each transaction's data in ``notes``; no uniqueness constraint, so a double shows."""

    def __init__(self, path: Path, crash: Crash | None = None, **options: Any) -> None:
        self.crash = crash

        def open_connection() -> DbApiConnection:
            return connect(path) if crash is None else CrashingConnection(connect(path), crash)

        with connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS notes (transaction_id INTEGER, data TEXT)")
        super().__init__(open_connection, **options)
        self.mounted_from: dict[int, int] = {}  # the first mark the client asked for, per partition

    def get_client_high_water_mark(self, partition_id: int) -> int:
        high_water_mark = super().get_client_high_water_mark(partition_id)
        self.mounted_from.setdefault(partition_id, high_water_mark)
        return high_water_mark

    def apply(self, transaction: Transaction, cursor: DbApiCursor) -> None:
        if self.crash is not None:
            self.crash.applying = transaction.transaction_id
        data = transaction.get_data().decode()
        cursor.execute("INSERT INTO notes VALUES (?, ?)", (transaction.transaction_id, data))


def notes(path: Path) -> list[tuple[int, str]]:
    with connect(path) as db:
        return [(int(t), str(d)) for t, d in db.execute("SELECT * FROM notes ORDER BY rowid")]


def stored_high_water_mark(path: Path) -> int:
    with connect(path) as db:
        (value,) = db.execute("SELECT high_water_mark FROM waltz_client_high_water_marks").fetchone()
    return int(value)


def expected_notes(count: int) -> list[tuple[int, str]]:
    return [(i, f"note-{i}") for i in range(count)]


def write_log(harness: WaltzMockHarness, count: int) -> None:
    """``count`` transactions in the mock log, written by a client of their own."""
    writer = SyncWaltzClient(MockCallbacks(), WaltzClientConfig(mock_driver=harness.new_driver()))
    try:
        for i in range(count):
            context = MockContext(f"note-{i}")
            writer.submit(context)
            assert context.future.result(WAIT_S)
    finally:
        writer.close()


def start_instance(harness: WaltzMockHarness, callbacks: DbApiClientCallbacks) -> SyncWaltzClient:
    # No reconnect delay: the crashed instance's re-feeds should not slow the test down.
    return SyncWaltzClient(
        callbacks, WaltzClientConfig(mock_driver=harness.new_driver(), reconnect_delay_ms=1)
    )


@pytest.mark.parametrize("when", [BEFORE_COMMIT, AFTER_COMMIT])
def test_crash_at_commit_then_restart_applies_every_transaction_once(tmp_path: Path, when: str) -> None:
    harness = WaltzMockHarness()
    path = tmp_path / "app.sqlite"
    write_log(harness, NUM_TRANSACTIONS)

    crash = Crash(CRASH_AT_TRANSACTION_ID, when)
    crashing = NotesCallbacks(path, crash)
    client = start_instance(harness, crashing)
    try:
        assert crash.dead.wait(WAIT_S), "the instance never reached the crash"
    finally:
        client.close()
        crashing.close()  # the dead process's connections go away, uncommitted work with them

    survived = CRASH_AT_TRANSACTION_ID + (1 if when == AFTER_COMMIT else 0)
    assert notes(path) == expected_notes(survived)
    assert stored_high_water_mark(path) == survived - 1

    restarted = NotesCallbacks(path)
    client = start_instance(harness, restarted)
    try:
        # Mounted from the database's mark (its feed may have gone on since: not the mark now).
        assert restarted.mounted_from[0] == survived - 1
        assert restarted.wait_for_high_water_mark(0, NUM_TRANSACTIONS - 1, WAIT_S)
    finally:
        client.close()
        restarted.close()
    assert notes(path) == expected_notes(NUM_TRANSACTIONS)
    assert stored_high_water_mark(path) == NUM_TRANSACTIONS - 1


def test_instances_sharing_a_database_apply_each_transaction_once(tmp_path: Path) -> None:
    harness = WaltzMockHarness()
    path = tmp_path / "shared.sqlite"
    write_log(harness, NUM_TRANSACTIONS)
    instances = [NotesCallbacks(path), NotesCallbacks(path)]
    clients = [start_instance(harness, callbacks) for callbacks in instances]
    try:
        for callbacks in instances:
            assert callbacks.wait_for_high_water_mark(0, NUM_TRANSACTIONS - 1, WAIT_S)
    finally:
        for client, callbacks in zip(clients, instances, strict=True):
            client.close()
            callbacks.close()
    assert sorted(notes(path)) == expected_notes(NUM_TRANSACTIONS)


def test_a_failing_apply_leaves_nothing_and_is_applied_again(tmp_path: Path) -> None:
    harness = WaltzMockHarness()
    path = tmp_path / "app.sqlite"
    write_log(harness, NUM_TRANSACTIONS)

    class FailOnce(NotesCallbacks):
        failed: list[int] = []

        def apply(self, transaction: Transaction, cursor: DbApiCursor) -> None:
            super().apply(transaction, cursor)  # written, then the failure: must be rolled back
            if transaction.transaction_id == CRASH_AT_TRANSACTION_ID and not self.failed:
                self.failed.append(transaction.transaction_id)
                raise RuntimeError("application bug (injected)")

    callbacks = FailOnce(path)
    client = start_instance(harness, callbacks)
    try:
        assert callbacks.wait_for_high_water_mark(0, NUM_TRANSACTIONS - 1, WAIT_S)
    finally:
        client.close()
        callbacks.close()
    assert FailOnce.failed == [CRASH_AT_TRANSACTION_ID]
    assert notes(path) == expected_notes(NUM_TRANSACTIONS)
