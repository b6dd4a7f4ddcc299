"""The bank service against the mock driver: declines overdrafts, retries lock failures."""

from __future__ import annotations

from pathlib import Path

import pytest
from bank_support import DEPOSIT, WITHDRAW, Bank, InsufficientFunds

from waltz_engine.client import WaltzClientConfig
from waltz_engine.client.mock_driver import MockDriver
from waltz_engine.client.pytest_plugin import WaltzMockHarness

NUM_PARTITIONS = 2
ACCOUNT = 7
WAIT_S = 30.0


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
