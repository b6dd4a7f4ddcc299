"""The store layer of a server (reference §2.7): replicated sessions over storage nodes, recovery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.server.store.config import StoreConfig
    from waltz_engine.server.store.errors import (
        GenerationMismatchError,
        RecoveryFailedError,
        SessionClosedError,
        StoreError,
        StorePartitionClosedError,
    )
    from waltz_engine.server.store.store import Store
    from waltz_engine.server.store.store_partition import StorePartition

_EXPORTS = {
    "StoreConfig": "config",
    "GenerationMismatchError": "errors",
    "RecoveryFailedError": "errors",
    "SessionClosedError": "errors",
    "StoreError": "errors",
    "StorePartitionClosedError": "errors",
    "Store": "store",
    "StorePartition": "store_partition",
}

__all__ = [
    "GenerationMismatchError",
    "RecoveryFailedError",
    "SessionClosedError",
    "Store",
    "StoreConfig",
    "StoreError",
    "StorePartition",
    "StorePartitionClosedError",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
