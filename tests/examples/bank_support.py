"""Makes ``examples`` importable as users run it (``python -m examples.bank`` from the repository root).

Plain ``pytest`` puts only the test directories on ``sys.path``; the examples are not an
installed package.
"""

from __future__ import annotations

import sys

from testkit import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.bank.service import (  # noqa: E402
    DEPOSIT,
    WITHDRAW,
    Bank,
    InsufficientFunds,
    open_database,
)

__all__ = ["DEPOSIT", "WITHDRAW", "Bank", "InsufficientFunds", "open_database"]
