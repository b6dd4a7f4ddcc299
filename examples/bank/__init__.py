"""A bank-account service on Waltz (the original's demo bank app, ``DemoBankApp``).

Run it against a local cluster (``waltz dev up`` writes ``.waltz-dev/client.yml``)::

    waltz dev up
    python -m examples.bank --config .waltz-dev/client.yml --db bank1.sqlite deposit 1 100
    python -m examples.bank --config .waltz-dev/client.yml --db bank2.sqlite withdraw 1 30
    python -m examples.bank --config .waltz-dev/client.yml --db bank1.sqlite balance 1      # 70
    python -m examples.bank --config .waltz-dev/client.yml --db bank1.sqlite               # interactive

Each ``--db`` file is one instance of the service; every instance applies the whole log, so
both files end up with the same balances. Transactions of other applications in the same log
(any header but ``BANK_HEADER``, e.g. a ``waltz append``) are skipped.
"""

from examples.bank.service import (
    BANK_HEADER,
    DEPOSIT,
    WITHDRAW,
    Bank,
    BankCallbacks,
    InsufficientFunds,
    Operation,
)

__all__ = ["BANK_HEADER", "DEPOSIT", "WITHDRAW", "Bank", "BankCallbacks", "InsufficientFunds", "Operation"]
