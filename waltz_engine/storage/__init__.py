"""The storage engine on disk: control file, segments, partitions (reference §1.4-§1.6).

Byte-compatible with Waltz 0.13.2's storage directories. The network node is built on
:class:`StorageManager`; every operation is synchronous (see ``partition.py`` for the
thread-safety contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.storage.control_file import (
        ConcurrentUpdateError,
        ControlFile,
        PartitionInfo,
        SessionInfo,
    )
    from waltz_engine.storage.partition import Partition
    from waltz_engine.storage.storage_manager import StorageManager

_EXPORTS = {
    "ConcurrentUpdateError": "control_file",
    "ControlFile": "control_file",
    "PartitionInfo": "control_file",
    "SessionInfo": "control_file",
    "Partition": "partition",
    "StorageManager": "storage_manager",
}

__all__ = [
    "ConcurrentUpdateError",
    "ControlFile",
    "Partition",
    "PartitionInfo",
    "SessionInfo",
    "StorageManager",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
