"""``python -m examples.bank --config CLIENT_YML --db FILE [COMMAND ...]``: one command, or a prompt.

Commands: ``deposit ACCOUNT AMOUNT``, ``withdraw ACCOUNT AMOUNT``, ``balance ACCOUNT``,
``history ACCOUNT``, and at the prompt ``help`` and ``quit``. See ``examples/bank/__init__.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from examples.bank.service import Bank, InsufficientFunds
from waltz_engine.client import WaltzClientConfig
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError

USAGE = """commands:
  deposit ACCOUNT AMOUNT    add AMOUNT to ACCOUNT
  withdraw ACCOUNT AMOUNT   take AMOUNT from ACCOUNT (declined if the balance is lower)
  balance ACCOUNT           the balance this instance has applied
  history ACCOUNT           every operation on ACCOUNT with the balance after it
  quit"""
PROMPT = "bank> "
EXIT_OK = 0
EXIT_DECLINED = 1
EXIT_ERROR = 2


class UsageError(Exception):
    pass


def run_command(bank: Bank, words: Sequence[str]) -> str:
    """Run one command; returns what to print. Raises UsageError or InsufficientFunds."""
    if not words:
        raise UsageError(USAGE)
    command, *args = words
    try:
        numbers = [int(a) for a in args]
    except ValueError:
        raise UsageError(f"{command}: ACCOUNT and AMOUNT are integers") from None
    if command in ("deposit", "withdraw") and len(numbers) == 2:
        account, amount = numbers
        if amount <= 0:
            raise UsageError(f"{command}: AMOUNT must be positive")
        action = bank.deposit if command == "deposit" else bank.withdraw
        return f"account {account}: balance {action(account, amount)}"
    if command == "balance" and len(numbers) == 1:
        return f"account {numbers[0]}: balance {bank.balance(numbers[0])}"
    if command == "history" and len(numbers) == 1:
        lines = [f"{amount:+d} -> {balance}" for amount, balance in bank.history(numbers[0])]
        return "\n".join(lines) or f"account {numbers[0]}: no operations"
    raise UsageError(USAGE)


def interact(bank: Bank) -> None:
    print(USAGE)
    while True:
        try:
            line = input(PROMPT)
        except EOFError:
            return
        words = line.split()
        if words in (["quit"], ["exit"]):
            return
        if not words:
            continue
        try:
            print(run_command(bank, words))
        except (UsageError, InsufficientFunds) as e:
            print(e)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.bank", epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="client YAML, e.g. .waltz-dev/client.yml")
    parser.add_argument("--db", required=True, help="this instance's SQLite file (created if missing)")
    parser.add_argument("command", nargs="*", help="one command; none: an interactive prompt")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with Bank(WaltzClientConfig.from_config(Config.load(args.config)), args.db) as bank:
            # A new process may be behind the log: apply what is there before answering.
            bank.catch_up()
            if not args.command:
                interact(bank)
                return EXIT_OK
            print(run_command(bank, args.command))
            return EXIT_OK
    except InsufficientFunds as e:
        print(e, file=sys.stderr)
        return EXIT_DECLINED
    except (UsageError, WaltzError, TimeoutError, OSError) as e:
        print(e, file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
