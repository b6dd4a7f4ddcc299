"""The simulated cluster's fixed settings: its ZooKeeper, ports, session timeout and host names.

One home for the values more than one module of the simulator needs (the world builds the
cluster from them; its checks, liveness bound and faults are measured against them). It imports
nothing, so any module of the simulator may import it without a cycle.
"""

from __future__ import annotations

CLUSTER_ROOT = "/waltz"
CLUSTER_NAME = "sim"
ZOOKEEPER_HOST = "zookeeper:2181"
STORAGE_PORT = 7000
STORAGE_ADMIN_PORT = 7001
SERVER_PORT = 6000
# Every node's ZooKeeper session (servers' and storage nodes'): a node paused or cut off longer
# than this loses its session, and a server's partitions go to another.
SESSION_TIMEOUT_MS = 10_000
# The hosts on the simulated network beside the storage nodes and servers.
CLIENT_HOST = "client-0"
ROGUE_HOST = "rogue-0"  # a client that forges a session id (with ACLs: one no grant names)
OPERATOR_HOST = "operator"  # the operator's tools
