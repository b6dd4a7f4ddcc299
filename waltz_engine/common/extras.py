"""The optional parts of the install (pyproject's extras): the base package (client, nodes, CLI)
leaves out the heavy dependencies that only one feature uses, and that feature says in one
line how to add them.
"""

from __future__ import annotations

import importlib.util

from waltz_engine.common.errors import WaltzError

DISTRIBUTION = "waltz-py"
SPARK = "spark"  # the Spark data source and export: pyspark, pandas, pyarrow
BACKUP = "backup"  # `waltz backup` through pyarrow.fs


class MissingExtraError(WaltzError, ImportError):
    """A feature's optional dependencies are not installed (an ImportError, so that code probing
    for the feature with ``try: import ...`` keeps working)."""


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]' (in a clone: pip install -e '.[{extra}]')"


def require(extra: str, feature: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` naming the first of ``modules`` that is not installed.

    Looks the modules up without importing them: the caller imports them where they are used.
    """
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(
                f"{feature} needs the [{extra}] extra ({module} is not installed): {install_hint(extra)}"
            )
