"""`waltz storage decommission` (issue 24 item 1) with real processes: under load, killed
(`kill -9`) while it copies, run again: the node holds nothing, every partition keeps 3
caught-up replicas with equal records, and no acknowledged transaction is lost."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import pytest
from cluster_support import CLI_TIMEOUT_S, append_lines, local_cluster, run_waltz_cli, waltz_cli_command
from nodes_support import assert_nothing_lost, assert_replicas_caught_up_and_equal, load, replica_sets

from waltz_engine.ops.devcluster import LocalCluster

PARTITIONS = 4
REPLICAS = 3
# Enough bytes that a copy at SLOW_COPY_BYTES_PER_S is still running when it is killed.
PRELOAD_TRANSACTIONS = 100
PRELOAD_BYTES = 200
SLOW_COPY_BYTES_PER_S = 2_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory, storages=4, servers=1, partitions=PARTITIONS, zookeeper=zookeeper, replicas=REPLICAS
    ) as c:
        append_lines(c, {p: [f"{p:x}" * PRELOAD_BYTES] * PRELOAD_TRANSACTIONS for p in range(PARTITIONS)})
        yield c


def kill_at(arguments: list[str], line: str) -> str:
    """Start `waltz ARGS`, kill it (SIGKILL) once it prints ``line`` on stderr; what it printed."""
    process = subprocess.Popen(
        waltz_cli_command(*arguments), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = []
    try:
        assert process.stderr is not None
        for printed in process.stderr:
            seen.append(printed)
            if line in printed:
                process.send_signal(signal.SIGKILL)
                break
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(CLI_TIMEOUT_S)
    assert any(line in s for s in seen), "".join(seen)
    return "".join(seen)


def test_decommission_killed_while_copying_then_run_again(cluster: LocalCluster) -> None:
    leaving = cluster.storages[3].connect_string
    before = replica_sets(cluster)
    config = str(cluster.client_config_path)
    with load(cluster, PARTITIONS, "decommission") as acknowledged:
        kill_at(
            [
                "storage",
                "decommission",
                "-c",
                config,
                "-s",
                leaving,
                "--bytes-per-second",
                str(SLOW_COPY_BYTES_PER_S),
            ],
            "copying from",
        )
        done = run_waltz_cli("storage", "decommission", "-c", config, "-s", leaving, "--wait", "--json")
        assert done.returncode == 0, done.stderr
    after = replica_sets(cluster)
    assert all(leaving not in holders and len(holders) == REPLICAS for holders in after.values()), after
    assert all(before[p] - {leaving} <= after[p] for p in before), (before, after)
    assert_nothing_lost(cluster, PARTITIONS, acknowledged)
    assert_replicas_caught_up_and_equal(cluster)
    # The node was told: it holds no partition any more (its files kept).
    listed = run_waltz_cli("storage", "list", "-c", config, "-s", leaving, "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"is_assigned": true' not in listed.stdout and '"is_assigned": false' in listed.stdout
