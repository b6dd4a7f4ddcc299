"""Storage nodes that come and go (issue 24), with real processes, on one cluster of 4 storage
nodes, 3 replicas per partition and two servers (both watching, one acting at a time), under load:

- a node that hangs and answers again within the grace keeps its replicas;
- a node killed with `kill -9` has every replica moved to the live nodes within grace + 60 s by
  exactly one server; when it comes back it is told it no longer holds them, its files kept.

(`waltz storage decommission` killed at each step: test_decommission_resumed.py.)

Each ends with 3 caught-up replicas per partition, equal records, nothing acknowledged lost.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import nodes_support
import pytest
from cluster_support import local_cluster
from nodes_support import (
    assert_nothing_lost,
    assert_replicas_caught_up_and_equal,
    load,
    node_holds,
    preload,
    replica_sets,
)

from waltz_engine.ops.devcluster import LocalCluster

PARTITIONS = 4
REPLICAS = 3
GRACE_MS = 20_000
# What the issue allows after the grace for every partition to have its replicas again.
RECOVERY_MS = GRACE_MS + 60_000
# Records for the moves to copy besides what the load appends.
PRELOAD_TRANSACTIONS = 100
PRELOAD_BYTES = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory,
        storages=4,
        servers=2,
        partitions=PARTITIONS,
        zookeeper=zookeeper,
        replicas=REPLICAS,
        server_config={"server.autoRecovery.graceMs": GRACE_MS},
    ) as c:
        preload(c, PARTITIONS, PRELOAD_TRANSACTIONS, PRELOAD_BYTES)
        yield c


def wait_for(what: str, check: Callable[[], bool]) -> None:
    nodes_support.wait_for(what, check, RECOVERY_MS)


def server_logs(cluster: LocalCluster) -> str:
    return "".join(server.log_text() for server in cluster.servers)


def test_a_node_back_within_the_grace_keeps_its_replicas(cluster: LocalCluster) -> None:
    node = cluster.storages[0]
    before = replica_sets(cluster)
    gone = f"storage node {node.connect_string} does not answer"
    back = re.compile(
        rf"storage node {re.escape(node.connect_string)} answers again after \d+ ms, within the grace"
    )
    node.pause()
    try:
        wait_for("a server notices the node is gone", lambda: gone in server_logs(cluster))
    finally:
        node.resume()
    wait_for("a server sees it back within the grace", lambda: back.search(server_logs(cluster)) is not None)
    assert replica_sets(cluster) == before
    assert "is past the grace" not in server_logs(cluster)


def test_a_killed_node_has_its_replicas_moved_once_then_is_told(cluster: LocalCluster) -> None:
    lost = cluster.storages[3]
    name = lost.connect_string
    before = replica_sets(cluster)
    held = sorted(p for p, holders in before.items() if name in holders)
    with load(cluster, PARTITIONS, "recovery") as acknowledged:
        lost.kill()
        started = time.monotonic()
        wait_for(
            "every partition has 3 replicas on live nodes",
            lambda: all(name not in h and len(h) == REPLICAS for h in replica_sets(cluster).values()),
        )
        assert (time.monotonic() - started) * 1000 < RECOVERY_MS
    after = replica_sets(cluster)
    assert all(before[p] - {name} <= after[p] for p in before), (before, after)
    logs = server_logs(cluster)
    # Both servers saw it gone; one decided, once, for every partition it held.
    assert logs.count(f"storage node {name} does not answer") == 2, logs
    decisions = re.findall(rf"storage node {re.escape(name)} is past the grace: moving (.*)", logs)
    assert len(decisions) == 1, decisions
    assert sorted(int(p) for p in re.findall(r"(\d+) to ", decisions[0])) == held
    assert_nothing_lost(cluster, PARTITIONS, acknowledged)
    assert_replicas_caught_up_and_equal(cluster)

    lost.start()
    wait_for("the node back after the grace is told it holds nothing", lambda: not node_holds(cluster, name))
    assert replica_sets(cluster) == after
    assert all((lost.data_directory / str(p)).is_dir() for p in held), "its files are kept"
