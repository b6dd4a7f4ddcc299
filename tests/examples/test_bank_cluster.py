"""The examples on a real cluster (3 storage nodes, 1 server): the bank (two instances, restarts, CLI,
a log shared with other applications), the producer and the consumer."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import closing
from pathlib import Path

from bank_support import DEPOSIT, WITHDRAW, Bank, stored_high_water_mark
from cluster_support import module_cluster, run_waltz_cli, waltz_client_config
from testkit import REPO_ROOT

from waltz_engine.ops.devcluster import LocalCluster

NUM_PARTITIONS = 4
NUM_ACCOUNTS = 4
OPENING_BALANCE = 100
OPERATIONS_PER_INSTANCE = 150
WITHDRAWAL_SHARE = 0.7
MIN_WITHDRAWAL, MAX_WITHDRAWAL = 10, 50
MIN_DEPOSIT, MAX_DEPOSIT = 5, 20
# Each test has its own accounts: every instance applies the whole log of the module's cluster.
RESTART_TEST_FIRST_ACCOUNT = 10
CLI_ACCOUNT = 42
# On partition 0 (20 % NUM_PARTITIONS), where the README's `waltz append --partition 0` writes.
FOREIGN_TEST_ACCOUNT = 20
FOREIGN_DATA = "hello, waltz"
# Well below the bank's own 60 s timeouts: a bank stuck on a foreign transaction fails quickly.
FOREIGN_TEST_TIMEOUT_S = 20.0
NUM_RESTARTS = 3
DEPOSITS_DURING_RESTARTS = 120
SEED = 4_8
WAIT_S = 60.0
CLI_TIMEOUT_S = 60.0
EXAMPLES = REPO_ROOT / "examples"

LedgerRow = tuple[int, int, int, int, int]  # partition, transaction id, account, amount, balance after


cluster = module_cluster(storages=3, partitions=NUM_PARTITIONS)


def ledger(path: Path) -> list[LedgerRow]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT * FROM ledger ORDER BY partition_id, transaction_id").fetchall()
    return [tuple(int(v) for v in row) for row in rows]  # type: ignore[misc]


def assert_applied_once(rows: list[LedgerRow]) -> None:
    keys = [(partition, txid) for partition, txid, *_ in rows]
    assert len(keys) == len(set(keys)), "a transaction was applied twice"


def balances(bank: Bank, first_account: int = 0) -> list[int]:
    return [bank.balance(first_account + i) for i in range(NUM_ACCOUNTS)]


def test_two_instances_never_overdraw_and_agree(cluster: LocalCluster, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    config = waltz_client_config(cluster)
    with Bank(config, tmp_path / "a.sqlite") as a, Bank(config, tmp_path / "b.sqlite") as b:
        for account in range(NUM_ACCOUNTS):
            a.deposit(account, OPENING_BALANCE)
        b.catch_up()

        submitted: list[tuple[Future[bool], int, int]] = []  # outcome, account, delta if applied
        lock = threading.Lock()

        def load(bank: Bank, seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(OPERATIONS_PER_INSTANCE):
                account = rng.randrange(NUM_ACCOUNTS)
                if rng.random() < WITHDRAWAL_SHARE:
                    amount = rng.randint(MIN_WITHDRAWAL, MAX_WITHDRAWAL)
                    outcome = (bank.submit(WITHDRAW, account, amount), account, -amount)
                else:
                    amount = rng.randint(MIN_DEPOSIT, MAX_DEPOSIT)
                    outcome = (bank.submit(DEPOSIT, account, amount), account, amount)
                with lock:
                    submitted.append(outcome)

        threads = [threading.Thread(target=load, args=(bank, rng.random())) for bank in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()

        expected = [OPENING_BALANCE] * NUM_ACCOUNTS
        declined = 0
        for outcome, account, delta in submitted:
            if outcome.result(WAIT_S):
                expected[account] += delta
            else:
                declined += 1
        a.catch_up()
        b.catch_up()

        assert balances(a) == balances(b) == expected
        assert ledger(a.database) == ledger(b.database)
        assert_applied_once(ledger(a.database))
        assert min(balance for *_, balance in ledger(a.database)) >= 0  # never overdrawn, at any point
        # The race was real: stale decisions were rejected by the server and some withdrawals declined.
        assert a.lock_failures + b.lock_failures > 0
        assert declined > 0


def test_restarted_instance_applies_nothing_twice(cluster: LocalCluster, tmp_path: Path) -> None:
    config = waltz_client_config(cluster)
    path = tmp_path / "restarted.sqlite"
    with Bank(config, tmp_path / "steady.sqlite") as steady:
        producer_error: list[BaseException] = []

        def produce() -> None:
            try:
                for i in range(DEPOSITS_DURING_RESTARTS):
                    steady.submit(DEPOSIT, RESTART_TEST_FIRST_ACCOUNT + i % NUM_ACCOUNTS, 1).result(WAIT_S)
            except BaseException as e:  # reported by the main thread
                producer_error.append(e)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            for restart in range(NUM_RESTARTS):
                with Bank(config, path) as restarted:  # closes mid-stream; the next one resumes
                    restarted.deposit(RESTART_TEST_FIRST_ACCOUNT + restart % NUM_ACCOUNTS, 1)
                    assert_applied_once(ledger(path))
        finally:
            producer.join(WAIT_S)
        assert not producer.is_alive() and producer_error == []

        with Bank(config, path) as restarted:
            restarted.catch_up()
            steady.catch_up()
            assert ledger(path) == ledger(steady.database)
            assert_applied_once(ledger(path))
            total = sum(balances(restarted, RESTART_TEST_FIRST_ACCOUNT))
            assert total == DEPOSITS_DURING_RESTARTS + NUM_RESTARTS


def run_cli(
    cluster: LocalCluster,
    database: Path,
    *command: str,
    stdin: str | None = None,
    timeout_s: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.bank",
            "--config",
            str(cluster.client_config_path),
            "--db",
            str(database),
        ]
        + list(command),
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_foreign_transaction_is_skipped_once(cluster: LocalCluster, tmp_path: Path) -> None:
    """The README's dev cluster: `waltz append` wrote a line (header 0) before the bank runs."""
    partition = FOREIGN_TEST_ACCOUNT % NUM_PARTITIONS
    appended = run_waltz_cli(
        "append",
        "--partition",
        str(partition),
        "--config",
        str(cluster.client_config_path),
        "-",
        stdin=FOREIGN_DATA + "\n",
    )
    assert appended.returncode == 0, appended.stderr
    foreign_id = int(appended.stdout.split()[-1])

    config = waltz_client_config(cluster)
    path = tmp_path / "foreign.sqlite"
    started = time.monotonic()
    with Bank(config, path) as bank:
        bank.catch_up(FOREIGN_TEST_TIMEOUT_S)  # the foreign transaction does not stop the feed
        assert bank.deposit(FOREIGN_TEST_ACCOUNT, 100) == 100
        assert bank.skipped_transactions >= 1  # ours, and any the producer test wrote
    assert time.monotonic() - started < FOREIGN_TEST_TIMEOUT_S
    assert (partition, foreign_id) not in [(p, txid) for p, txid, *_ in ledger(path)]
    # Skipped, it moved the database's mark like an applied operation: the deposit came after it.
    assert stored_high_water_mark(path, partition) > foreign_id

    with Bank(config, path) as restarted:
        restarted.catch_up(FOREIGN_TEST_TIMEOUT_S)
        assert restarted.skipped_transactions == 0  # mounted after it: not fed again
        assert restarted.balance(FOREIGN_TEST_ACCOUNT) == 100

    # The command: a fresh instance applies the whole partition, the foreign line included.
    account = str(FOREIGN_TEST_ACCOUNT)
    deposit = run_cli(
        cluster, tmp_path / "cli.sqlite", "deposit", account, "5", timeout_s=FOREIGN_TEST_TIMEOUT_S
    )
    assert (deposit.returncode, deposit.stdout) == (0, f"account {account}: balance 105\n"), deposit.stderr


def test_cli_each_run_a_restart(cluster: LocalCluster, tmp_path: Path) -> None:
    first, second = tmp_path / "cli1.sqlite", tmp_path / "cli2.sqlite"
    account = str(CLI_ACCOUNT)
    deposit = run_cli(cluster, first, "deposit", account, "100")
    assert (deposit.returncode, deposit.stdout) == (0, "account 42: balance 100\n"), deposit.stderr
    overdraft = run_cli(cluster, second, "withdraw", account, "150")
    assert overdraft.returncode == 1 and "balance 100 < 150" in overdraft.stderr
    withdraw = run_cli(cluster, second, "withdraw", account, "30")
    assert (withdraw.returncode, withdraw.stdout) == (0, "account 42: balance 70\n"), withdraw.stderr
    balance = run_cli(cluster, first, "balance", account)
    assert (balance.returncode, balance.stdout) == (0, "account 42: balance 70\n"), balance.stderr
    assert ledger(first) == ledger(second)
    assert [amount for _, _, acc, amount, _ in ledger(first) if acc == CLI_ACCOUNT] == [100, -30]
    usage = run_cli(cluster, first, "withdraw", account, "-5")
    assert usage.returncode == 2 and "positive" in usage.stderr
    session = run_cli(
        cluster, second, stdin=f"deposit {account} 5\nwithdraw {account} 500\nbalance {account}\nquit\n"
    )
    assert session.returncode == 0, session.stderr
    assert "account 42: balance 75" in session.stdout and "balance 75 < 500" in session.stdout


def test_producer_then_consumer(cluster: LocalCluster) -> None:
    config = str(cluster.client_config_path)
    messages = ["hello", "waltz"]
    produced = subprocess.run(
        [sys.executable, str(EXAMPLES / "producer.py"), "--config", config, *messages],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert (produced.returncode, produced.stdout) == (0, "appended: hello\nappended: waltz\n"), (
        produced.stderr
    )
    consumer = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "consumer.py"), "--config", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Lines come until the consumer is stopped: read until both messages were printed (bounded
        # by the watchdog that interrupts the consumer).
        watchdog = threading.Timer(CLI_TIMEOUT_S, consumer.send_signal, (signal.SIGINT,))
        watchdog.start()
        seen: set[str] = set()
        assert consumer.stdout is not None
        for line in consumer.stdout:
            seen.update(m for m in messages if line.rstrip().endswith(f": {m}"))
            if seen == set(messages):
                break
        watchdog.cancel()
        assert seen == set(messages)
        consumer.send_signal(signal.SIGINT)
        # What it still prints is read: a writer blocked on a full pipe could not exit.
        consumer.communicate(timeout=CLI_TIMEOUT_S)
        assert consumer.returncode == 0
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(CLI_TIMEOUT_S)
