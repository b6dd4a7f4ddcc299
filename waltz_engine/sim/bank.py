"""The bank workload (``waltz sim --workload bank``): transfers between accounts under optimistic locks.

Each transfer reads the balances the application has applied, declines when its source account
cannot pay, and otherwise appends with a write lock on both accounts: a transfer computed from
balances another committed transfer has since changed must fail on its lock and run again on
the newer balances. The ledger applies the log in order and checks what optimistic concurrency
promises: no balance goes negative, and no committed transfer touched an account written after
the high-water mark its balances were read at (a lost update).
"""

from __future__ import annotations

import asyncio
import random

from waltz_engine.client import Transaction, TransactionBuilder
from waltz_engine.common.reqid import ReqId
from waltz_engine.sim.workload import RAW, SimContext

ACCOUNTS = 5
INITIAL_BALANCE = 100
MAX_AMOUNT = 60
LOCK_NAME = "account"
_NO_WRITE = -1


class Ledger:
    """The application's balances, as of the transactions applied so far."""

    def __init__(self) -> None:
        self.balances = [INITIAL_BALANCE] * ACCOUNTS
        self.high_water_mark = -1
        self.transfers: dict[int, tuple[int, int, int]] = {}  # number -> (source, target, amount)
        self._last_write = [_NO_WRITE] * ACCOUNTS  # txid of the last transfer touching the account
        self._read_marks: dict[ReqId, int] = {}  # each attempt's high-water mark of its balances
        self.violations: list[str] = []

    def plan(self, number: int, rng: random.Random) -> None:
        """Transfer ``number``: between two accounts drawn from ``rng``, an amount up to MAX_AMOUNT."""
        source = rng.randrange(ACCOUNTS)
        target = (source + 1 + rng.randrange(ACCOUNTS - 1)) % ACCOUNTS
        self.transfers[number] = (source, target, rng.randint(1, MAX_AMOUNT))

    def read(self, req_id: ReqId, account: int) -> int:
        """An attempt reads a balance; the ledger remembers as of which transaction."""
        self._read_marks[req_id] = self.high_water_mark
        return self.balances[account]

    def apply(self, transaction: Transaction) -> None:
        txid = transaction.transaction_id
        self.high_water_mark = txid
        transfer = self.transfers.get(transaction.header)
        read_mark = self._read_marks.pop(transaction.req_id, None)
        if transfer is None or read_mark is None:
            self.violations.append(f"txid {txid}: no attempt of transfer {transaction.header} was executed")
            return
        source, target, amount = transfer
        for account in (source, target):
            if self._last_write[account] > read_mark:
                self.violations.append(
                    f"txid {txid}: transfer {transaction.header} committed on balances read at txid "
                    f"{read_mark}, but account {account} was written at txid {self._last_write[account]} "
                    "(a lost update)"
                )
            self._last_write[account] = txid
        self.balances[source] -= amount
        self.balances[target] += amount
        if self.balances[source] < 0:
            self.violations.append(f"txid {txid}: account {source} overdrawn to {self.balances[source]}")


class Transfer(SimContext):
    """Moves ``amount`` from ``source`` to ``target`` if ``source`` can pay, holding both accounts' locks."""

    def __init__(
        self,
        number: int,
        outcome: asyncio.Future[bool],
        refuses_retry: bool,
        ledger: Ledger,
        data: bytes | None = None,
    ) -> None:
        super().__init__(number, outcome, refuses_retry, data)
        self.ledger = ledger
        self.source, self.target, self.amount = ledger.transfers[number]

    def fill(self, builder: TransactionBuilder) -> bool:
        if self.ledger.read(builder.req_id, self.source) < self.amount:
            return False
        builder.set_transaction_data(self.data, RAW)
        builder.set_write_locks([(LOCK_NAME, self.source), (LOCK_NAME, self.target)])
        return True
