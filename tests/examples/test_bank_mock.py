"""The bank service against the mock driver: declines overdrafts, retries lock failures, skips
other applications' transactions."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from bank_support import DEPOSIT, WITHDRAW, Bank, InsufficientFunds, stored_high_water_mark
from client_support.app import MockCallbacks, MockContext

from waltz_engine.client import OutcomeUnknownError, WaltzClientConfig
from waltz_engine.client.mock_driver import MockDriver
from waltz_engine.client.pytest_plugin import WaltzMockHarness

NUM_PARTITIONS = 2
ACCOUNT = 7
WAIT_S = 30.0
# Well below the bank's own timeouts: a bank stuck on a transaction fails the test quickly.
CATCH_UP_S = 10.0
BANK_LOGGER = "examples.bank.service"
UNDECIDED_FLUSH_TIMEOUT_MS = 200  # the bank's flush at close gives up this soon


def open_bank(harness: WaltzMockHarness, path: Path) -> tuple[Bank, MockDriver]:
    driver = harness.new_driver()
    return Bank(WaltzClientConfig(mock_driver=driver), path), driver


def test_withdrawal_beyond_the_balance_is_declined(tmp_path: Path) -> None:
    harness = WaltzMockHarness(NUM_PARTITIONS)
    bank, _ = open_bank(harness, tmp_path / "bank.sqlite")
    with bank:
        assert bank.deposit(ACCOUNT, 100) == 100
        assert bank.withdraw(ACCOUNT, 60) == 40
        with pytest.raises(InsufficientFunds):
            bank.withdraw(ACCOUNT, 41)
        assert bank.withdraw(ACCOUNT, 40) == 0
        assert bank.balance(ACCOUNT) == 0
        assert bank.history(ACCOUNT) == [(100, 100), (-60, 40), (-40, 0)]
    assert harness.partitions[ACCOUNT % NUM_PARTITIONS].high_water_mark == 2  # nothing else was written


def test_lock_failure_is_retried_and_applied_once(tmp_path: Path) -> None:
    harness = WaltzMockHarness(NUM_PARTITIONS)
    bank, driver = open_bank(harness, tmp_path / "bank.sqlite")
    with bank:
        bank.deposit(ACCOUNT, 100)
        driver.force_next_lock_fail()
        assert bank.withdraw(ACCOUNT, 30) == 70
        assert bank.lock_failures == 1
        assert bank.history(ACCOUNT) == [(100, 100), (-30, 70)]


def test_concurrent_withdrawals_on_two_instances_never_overdraw(tmp_path: Path) -> None:
    """B decides on a stale balance; the server's lock check rejects it, the retry declines it."""
    harness = WaltzMockHarness(NUM_PARTITIONS)
    first, _ = open_bank(harness, tmp_path / "first.sqlite")
    second, second_driver = open_bank(harness, tmp_path / "second.sqlite")
    with first, second:
        first.deposit(ACCOUNT, 100)
        second.catch_up()
        assert second.balance(ACCOUNT) == 100

        second_driver.suspend_feed()  # B does not learn about A's withdrawal yet
        assert first.withdraw(ACCOUNT, 80) == 20
        stale = second.submit(WITHDRAW, ACCOUNT, 80)  # decided on B's balance of 100
        second_driver.resume_feed()

        assert stale.result(WAIT_S) is False  # the retry saw 20 and declined
        assert second.lock_failures == 1
        second.catch_up()
        assert first.balance(ACCOUNT) == second.balance(ACCOUNT) == 20
        assert first.history(ACCOUNT) == second.history(ACCOUNT) == [(100, 100), (-80, 20)]


def test_operations_on_different_accounts_go_to_their_partitions(tmp_path: Path) -> None:
    harness = WaltzMockHarness(NUM_PARTITIONS)
    bank, _ = open_bank(harness, tmp_path / "bank.sqlite")
    with bank:
        outcomes = [bank.submit(DEPOSIT, account, 10) for account in range(4)]
        assert all(outcome.result(WAIT_S) for outcome in outcomes)
    assert [p.high_water_mark for p in harness.partitions.values()] == [1, 1]


def test_other_applications_transactions_are_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A shared log: what another application wrote (other headers) is skipped, and stays skipped."""
    harness = WaltzMockHarness(NUM_PARTITIONS)
    partition = ACCOUNT % NUM_PARTITIONS
    foreign = [
        MockContext("hello, waltz", partition=partition),  # what `waltz append` writes: header 0
        # Another header, even with data that looks like the bank's (the bank's old DEPOSIT header).
        MockContext(f'{{"account": {ACCOUNT}, "amount": 5}}', partition=partition, header=DEPOSIT),
    ]
    writer = harness.client(MockCallbacks(), harness.new_driver())
    try:
        for context in foreign:
            writer.submit(context)
            assert context.future.result(WAIT_S)
    finally:
        writer.close()

    caplog.set_level(logging.DEBUG, logger=BANK_LOGGER)
    path = tmp_path / "bank.sqlite"
    bank, _ = open_bank(harness, path)
    with bank:
        bank.catch_up(CATCH_UP_S)  # the foreign transactions do not stop the feed
        assert bank.deposit(ACCOUNT, 100) == 100
        assert bank.history(ACCOUNT) == [(100, 100)]
        assert bank.skipped_transactions == len(foreign)
    skipped_logs = [r for r in caplog.records if r.name == BANK_LOGGER and "skipped" in r.getMessage()]
    assert [r.levelno for r in skipped_logs] == [logging.DEBUG] * len(foreign)
    # The skipped transactions moved the database's mark like the applied deposit did.
    assert stored_high_water_mark(path, partition) == len(foreign)

    restarted, _ = open_bank(harness, path)
    with restarted:
        restarted.catch_up(CATCH_UP_S)
        assert restarted.skipped_transactions == 0  # mounted after them: not fed again
        assert restarted.balance(ACCOUNT) == 100
        assert restarted.history(ACCOUNT) == [(100, 100)]


def test_an_unknown_outcome_is_applied_once_from_the_log(tmp_path: Path) -> None:
    """The bank closes with a deposit undecided: the caller learns its outcome is unknown (not
    "failed": it may be in the log), the bank never submits it again, and the next instance
    applies it exactly once, from the log."""
    harness = WaltzMockHarness(NUM_PARTITIONS)
    driver = harness.new_driver()
    path = tmp_path / "bank.sqlite"
    bank = Bank(WaltzClientConfig(mock_driver=driver, flush_timeout_ms=UNDECIDED_FLUSH_TIMEOUT_MS), path)
    driver.suspend_feed()  # committed on the server, but this instance cannot learn it
    outcome = bank.submit(DEPOSIT, ACCOUNT, 100)
    bank.close()
    with pytest.raises(OutcomeUnknownError):
        outcome.result(WAIT_S)
    again, _ = open_bank(harness, path)
    with again:
        again.catch_up(CATCH_UP_S)
        assert again.history(ACCOUNT) == [(100, 100)]
    assert harness.partitions[ACCOUNT % NUM_PARTITIONS].high_water_mark == 0  # sent once
