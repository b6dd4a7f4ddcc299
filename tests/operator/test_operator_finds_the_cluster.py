"""Cluster commands find the cluster with no flags: next to a dev cluster (its
``.waltz-dev/client.yml`` in the working directory), or from ``WALTZ_ZOOKEEPER`` and
``WALTZ_CLUSTER_ROOT`` alone. Real processes: a cluster, and `waltz` run as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cluster_support import module_cluster, waltz_cli_command
from zygote import run_forked

from waltz_engine.common.config import DEV_CLIENT_CONFIG_NAME, DEV_CLUSTER_DIRECTORY
from waltz_engine.ops.devcluster import LocalCluster

CLI_TIMEOUT_S = 120.0
NUM_PARTITIONS = 2
ENVIRONMENT_KEYS = ("WALTZ_CONFIG", "WALTZ_ZOOKEEPER", "WALTZ_CLUSTER_ROOT")
# Each command with no flag but --json, and what its JSON must show of this cluster.
COMMANDS = (
    ("cluster", "verify"),
    ("storage", "list"),
    ("zk", "list"),
    ("retention", "show"),
)


cluster = module_cluster(storages=1, partitions=NUM_PARTITIONS)


def waltz(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT_KEYS}
    return run_forked(waltz_cli_command(*args), args, cwd=cwd, env={**clean, **env}, timeout_s=CLI_TIMEOUT_S)


def check_output(
    cluster: LocalCluster, command: tuple[str, ...], result: subprocess.CompletedProcess[str]
) -> None:
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    found = json.loads(result.stdout)
    if command == ("cluster", "verify"):
        assert found["passed"] is True
        assert [p["partition"] for p in found["partitions"]] == list(range(NUM_PARTITIONS))
    elif command == ("storage", "list"):
        [node] = found["nodes"]
        assert node["storage"] == cluster.storages[0].connect_string
        assert sorted(p["partition_id"] for p in node["partitions"]) == list(range(NUM_PARTITIONS))
    elif command == ("zk", "list"):
        assert found["cluster_root"] == cluster.cluster_root
        assert any(z["path"] == f"{cluster.cluster_root}/store" for z in found["znodes"])
    else:
        assert [p["partition"] for p in found["partitions"]] == list(range(NUM_PARTITIONS))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_no_flags_next_to_a_dev_cluster(
    cluster: LocalCluster, tmp_path: Path, command: tuple[str, ...]
) -> None:
    dev = tmp_path / DEV_CLUSTER_DIRECTORY
    dev.mkdir()
    shutil.copy(cluster.client_config_path, dev / DEV_CLIENT_CONFIG_NAME)
    check_output(cluster, command, waltz(*command, "--json", cwd=tmp_path, env={}))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_no_flags_with_the_environment(
    cluster: LocalCluster, tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = {"WALTZ_ZOOKEEPER": cluster.zookeeper, "WALTZ_CLUSTER_ROOT": cluster.cluster_root}
    check_output(cluster, command, waltz(*command, "--json", cwd=tmp_path, env=env))


def test_no_flags_and_no_cluster_is_one_line(tmp_path: Path) -> None:
    for command in COMMANDS:
        result = waltz(*command, cwd=tmp_path, env={})
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "no zookeeper.connectString given" in lines[0], (command, result.stderr)
        assert "waltz dev up" in lines[0]
