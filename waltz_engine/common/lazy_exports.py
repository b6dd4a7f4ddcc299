"""A package's public names, imported on first use (PEP 562).

``import waltz_engine.client.config`` runs the package's ``__init__`` first: with eager re-exports
every command line tool would import the whole client (and the storage engine numpy) to read a
config. Packages list their exports here and import them under ``TYPE_CHECKING`` for the type
checker.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``exports`` maps a public name to its submodule."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # later lookups are plain attribute reads
        return value

    return __getattr__
