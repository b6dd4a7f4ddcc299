"""The smoke test's cluster: a :class:`LocalCluster` whose storage nodes sit behind proxies.

How server↔storage connections get a proxy without touching ZooKeeper's store metadata: each
storage node keeps its registered data port (the ``host:port`` every store map is keyed by,
which servers connect to), but its process listens on a second, private "backend" port;
a ``TcpProxy`` owned by the smoke runner listens on the registered port and forwards to
the backend. Only the node's ``storage.port`` in its storage.yml differs from a plain dev
cluster, so metadata, ``cluster verify`` and the admin port stay as they are.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from waltz_engine.ops.devcluster import STORAGE, LocalCluster, LocalNode, free_port
from waltz_engine.smoke.schedule import NUM_SERVERS, NUM_STORAGES
from waltz_engine.storage.node.config import KEY_PORT, KEY_SEGMENT_SIZE_THRESHOLD

BACKEND_PORT = "backend_port"
# Small segments, so that a run seals several per partition (a sealed-segment flip needs one).
SEGMENT_SIZE_THRESHOLD_BYTES = 128 * 1024
KEY_NODE_PORT = "port"  # LocalNode.ports: the registered data port


class ProxiedCluster(LocalCluster):
    def __init__(self, directory: Path, partitions: int) -> None:
        super().__init__(
            directory,
            NUM_STORAGES,
            NUM_SERVERS,
            partitions,
            storage_config={KEY_SEGMENT_SIZE_THRESHOLD: SEGMENT_SIZE_THRESHOLD_BYTES},
        )
        for node in self.storages:
            node.ports.setdefault(BACKEND_PORT, free_port())

    def _write_node_configs(self) -> None:
        super()._write_node_configs()
        for node in self.storages:
            config = yaml.safe_load(node.config_path.read_text(encoding="utf-8"))
            config[KEY_PORT] = backend_port(node)
            self._write_yaml(node.config_path, config)

    def process_ports(self, node: LocalNode) -> dict[str, int]:
        ports = super().process_ports(node)
        if node.kind == STORAGE:
            del ports[KEY_NODE_PORT]  # its proxy's, listening before the cluster comes up
        return ports

    def node(self, name: str) -> LocalNode:
        return next(n for n in self.nodes if n.name == name)

    def stop_zookeeper(self) -> None:
        embedded = self.embedded_zookeeper
        assert embedded is not None, "the smoke cluster runs its own ZooKeeper"
        embedded.stop()

    def start_zookeeper(self) -> None:
        embedded = self.embedded_zookeeper
        assert embedded is not None, "the smoke cluster runs its own ZooKeeper"
        embedded.start()


def backend_port(node: LocalNode) -> int:
    """The port a storage node's process really listens on (its proxy forwards there)."""
    return node.ports[BACKEND_PORT]
