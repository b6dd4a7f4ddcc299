"""The storage node process: TLS data and admin ports, HTTP endpoints, one worker per partition.

Built on the on-disk engine (:class:`waltz_engine.storage.StorageManager`); start it with
``waltz storage start --config FILE`` (:func:`run`) or in-process with :class:`StorageNode`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.storage.node.config import StorageConfig
    from waltz_engine.storage.node.node import StorageNode, run

_EXPORTS = {
    "StorageConfig": "config",
    "StorageNode": "node",
    "run": "node",
}

__all__ = ["StorageConfig", "StorageNode", "run"]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
