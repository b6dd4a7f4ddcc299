"""`waltz storage decommission` killed at each step and run again, then of a node already dead
(issue 24), with real processes, on one cluster of 4 storage nodes, 3 replicas per partition and
one server whose automatic re-replication is off (the command alone moves replicas), under load.

With 4 nodes and 3 replicas, each partition's new replica can only go to the one node that does
not hold it: every scenario ends with known replica sets, every replica caught up and equal,
nothing acknowledged lost, and no move left recorded but the telling of a dead node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from cluster_support import local_cluster, run_waltz_cli
from nodes_support import (
    assert_nothing_lost,
    assert_replicas_caught_up_and_equal,
    kill_at,
    load,
    node_holds,
    preload,
    replica_sets,
    short_session_config,
)

from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.zk import replica_moves
from waltz_engine.zk.connection import connect
from waltz_engine.zk.replica_moves import ReplicaMove

PARTITIONS = 4
REPLICAS = 3
# The shortest ZooKeeper session the test ZooKeeper grants (2 ticks): the lease of a killed
# decommission goes with it, and the next run waits that long for it.
LEASE_SESSION_TIMEOUT_MS = 4_000
# A copy at this rate is still on its first batch when it is killed.
PRELOAD_TRANSACTIONS = 50
PRELOAD_BYTES = 100
SLOW_COPY_BYTES_PER_S = 1_000
# The step each run is killed at, by the line it logs as the step begins (replica_mover.py).
STEPS = {
    "copy": "copying from",
    "assign": "assigning",
    "wait caught up": "to catch up to",
    "unassign": "out of the assignment",
    "release": "telling",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory,
        storages=4,
        servers=1,
        partitions=PARTITIONS,
        zookeeper=zookeeper,
        replicas=REPLICAS,
        server_config={"server.autoRecovery.graceMs": 0},
    ) as c:
        preload(c, PARTITIONS, PRELOAD_TRANSACTIONS, PRELOAD_BYTES)
        yield c


@pytest.fixture(scope="module")
def tools_config(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    return short_session_config(cluster, tmp_path_factory.mktemp("tools"), LEASE_SESSION_TIMEOUT_MS)


def moved_to_the_free_node(before: dict[int, set[str]], leaving: str, nodes: set[str]) -> dict[int, set[str]]:
    """The replica sets once ``leaving``'s replicas went to the one node without each partition."""
    return {p: (h - {leaving}) | (nodes - h) if leaving in h else h for p, h in before.items()}


def recorded_moves(cluster: LocalCluster) -> list[ReplicaMove]:
    with connect(cluster.zookeeper_settings()) as zk:
        return replica_moves.read_moves(zk, cluster.cluster_root)


def test_decommission_killed_at_every_step_and_run_again_moves_every_replica(
    cluster: LocalCluster, tools_config: str
) -> None:
    leaving = cluster.storages[0].connect_string
    nodes = {s.connect_string for s in cluster.storages}
    expected = moved_to_the_free_node(replica_sets(cluster), leaving, nodes)
    command = ["storage", "decommission", "-c", tools_config, "-s", leaving]
    with load(cluster, PARTITIONS, "decommission") as acknowledged:
        # Each run resumes the first recorded move where the one before was killed, and is
        # killed at the next step of it (or of the next partition, had the kill landed late).
        kill_at([*command, "--bytes-per-second", str(SLOW_COPY_BYTES_PER_S)], STEPS["copy"])
        resumed = "".join(kill_at([*command, "--wait"], STEPS["assign"]))
        for step in list(STEPS)[2:]:
            kill_at([*command, "--wait"], STEPS[step])
        done = run_waltz_cli(*command, "--wait", "--json")
        assert done.returncode == 0, done.stderr
    # The resumed copy went up to the servers' committed high-water mark, past the preload: not
    # only to the replicas' local low-water mark, which stays -1 until a store session starts.
    held = re.search(r"partition \d+: \S+ holds up to (-?\d+); online", resumed)
    assert held is not None and int(held[1]) >= PRELOAD_TRANSACTIONS - 1, resumed
    result = json.loads(done.stdout)
    assert result["storage"] == leaving and result["remaining_partitions"] == [], result
    assert result["moves"] and not result["unreleased"], result
    assert replica_sets(cluster) == expected
    assert recorded_moves(cluster) == []
    assert node_holds(cluster, leaving) == [], "the node was told it holds no partition any more"
    assert_nothing_lost(cluster, PARTITIONS, acknowledged)
    assert_replicas_caught_up_and_equal(cluster)


def test_decommission_of_a_dead_node_copies_from_the_live_replicas(
    cluster: LocalCluster, tools_config: str
) -> None:
    dead = cluster.storages[1]
    name = dead.connect_string
    nodes = {s.connect_string for s in cluster.storages}
    before = replica_sets(cluster)
    held = sorted(p for p, holders in before.items() if name in holders)
    expected = moved_to_the_free_node(before, name, nodes)
    with load(cluster, PARTITIONS, "dead") as acknowledged:
        dead.kill()
        done = run_waltz_cli("storage", "decommission", "-c", tools_config, "-s", name, "--wait")
        assert done.returncode == 0, done.stderr
    assert f"{name} holds no partition ({len(held)} moved; {len(held)} to tell the node when it answers)" in (
        done.stdout
    )
    sources = re.findall(r"partition \d+: copying from (\S+) to ", done.stderr)
    assert len(sources) == len(held) and name not in sources, done.stderr
    for p in held:
        (target,) = expected[p] - before[p]
        assert f"partition {p}: assigning {target} in place of unreachable {name}" in done.stderr
        assert f"partition {p}: {name} does not answer; it is told when it does (files kept)" in done.stderr
    assert replica_sets(cluster) == expected
    # Left recorded for whoever moves replicas next to tell the node once it answers.
    assert sorted(m.partition_id for m in recorded_moves(cluster)) == held
    assert_nothing_lost(cluster, PARTITIONS, acknowledged)
    assert_replicas_caught_up_and_equal(cluster)
