"""The storage engine on disk: control file, segments, partitions (reference §1.4-§1.6).

Byte-compatible with Waltz 0.13.2's storage directories. The network node is built on
:class:`StorageManager`; every operation is synchronous (see ``partition.py`` for the
thread-safety contract).
"""

from waltz_engine.storage.control_file import ConcurrentUpdateError, ControlFile, PartitionInfo, SessionInfo
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.storage_manager import StorageManager

__all__ = [
    "ConcurrentUpdateError",
    "ControlFile",
    "Partition",
    "PartitionInfo",
    "SessionInfo",
    "StorageManager",
]
