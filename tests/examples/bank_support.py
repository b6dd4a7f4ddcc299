"""Makes ``examples`` importable as users run it (``python -m examples.bank`` from the repository root).

Plain ``pytest`` puts only the test directories on ``sys.path``; the examples are not an
installed package.
"""

from __future__ import annotations

import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from testkit import REPO_ROOT

from waltz_engine.client.dbapi_callbacks import DEFAULT_TABLE

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from examples.bank.service import (  # noqa: E402
    DEPOSIT,
    WITHDRAW,
    Bank,
    InsufficientFunds,
    open_database,
)

__all__ = ["DEPOSIT", "WITHDRAW", "Bank", "InsufficientFunds", "open_database", "stored_high_water_mark"]


def stored_high_water_mark(path: Path, partition_id: int) -> int:
    """The high-water mark the bank's database holds for ``partition_id``."""
    with closing(sqlite3.connect(path)) as db:
        row = db.execute(
            f"SELECT high_water_mark FROM {DEFAULT_TABLE} WHERE partition_id = ?", (partition_id,)
        ).fetchone()
    return int(row[0])
