"""The store layer of a server (reference §2.7): replicated sessions over storage nodes, recovery."""

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
