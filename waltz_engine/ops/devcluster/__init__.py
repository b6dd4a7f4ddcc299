"""A whole Waltz cluster on one machine, for development and tests (the original's
``bin/test-cluster.sh``, without Docker; reference §4.8).

Layout of a cluster directory::

    devcluster.json          state: topology, ports, pids (so another process can stop it)
    client.yml               a client config for this cluster (zookeeper + cluster.root)
    zookeeper/               the embedded ZooKeeper (its own zoo.cfg, pid file and log)
    storage-<i>/             storage.yml, storage.log, data/
    server-<j>/              server.yml, server.log

Every node is a detached subprocess (its own session, so Ctrl-C in a terminal reaches only
the process that owns the cluster, which then stops the nodes in order). ``up`` on a
directory that already holds a cluster reuses its ports and data; on any other non-empty
directory it refuses. An ``up`` that fails half way stops what it started. ``down(clean=True)``
removes only the names above (and the directory when ``up`` made it and it is left empty), so
a file of someone else's in that directory survives. Every wait is bounded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.ops.devcluster.cluster import ClusterStatus, LocalCluster
    from waltz_engine.ops.devcluster.nodes import (
        DEFAULT_CLUSTER_ROOT,
        DEFAULT_DIRECTORY,
        DEFAULT_PARTITIONS,
        DEFAULT_SERVERS,
        DEFAULT_STORAGES,
        DEFAULT_WAIT_TIMEOUT_MS,
        HOST,
        PORTS_PER_SERVER,
        PORTS_PER_STORAGE,
        SERVER,
        STATE_FILE_NAME,
        STORAGE,
        ZOOKEEPER_DIR_NAME,
        DevClusterError,
        LocalNode,
        NodeStatus,
        free_port,
    )

_EXPORTS = {
    "ClusterStatus": "cluster",
    "LocalCluster": "cluster",
    "DEFAULT_CLUSTER_ROOT": "nodes",
    "DEFAULT_DIRECTORY": "nodes",
    "DEFAULT_PARTITIONS": "nodes",
    "DEFAULT_SERVERS": "nodes",
    "DEFAULT_STORAGES": "nodes",
    "DEFAULT_WAIT_TIMEOUT_MS": "nodes",
    "HOST": "nodes",
    "PORTS_PER_SERVER": "nodes",
    "PORTS_PER_STORAGE": "nodes",
    "SERVER": "nodes",
    "STATE_FILE_NAME": "nodes",
    "STORAGE": "nodes",
    "ZOOKEEPER_DIR_NAME": "nodes",
    "DevClusterError": "nodes",
    "LocalNode": "nodes",
    "NodeStatus": "nodes",
    "free_port": "nodes",
}

__all__ = [
    "ClusterStatus",
    "DEFAULT_CLUSTER_ROOT",
    "DEFAULT_DIRECTORY",
    "DEFAULT_PARTITIONS",
    "DEFAULT_SERVERS",
    "DEFAULT_STORAGES",
    "DEFAULT_WAIT_TIMEOUT_MS",
    "DevClusterError",
    "HOST",
    "LocalCluster",
    "LocalNode",
    "NodeStatus",
    "PORTS_PER_SERVER",
    "PORTS_PER_STORAGE",
    "SERVER",
    "STATE_FILE_NAME",
    "STORAGE",
    "ZOOKEEPER_DIR_NAME",
    "free_port",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
