"""The storage node process: TLS data and admin ports, HTTP endpoints, one worker per partition.

Built on the on-disk engine (:class:`waltz_engine.storage.StorageManager`); start it with
``waltz storage start --config FILE`` (:func:`run`) or in-process with :class:`StorageNode`.
"""

from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.storage.node.node import StorageNode, run

__all__ = ["StorageConfig", "StorageNode", "run"]
