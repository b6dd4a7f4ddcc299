"""Every command that prints data prints JSON with --json: run each against a real cluster and parse it.

The list of commands is checked against the tree: a new command with ``--json`` must be added
here (or to ``NOT_RUN_HERE`` with the test that covers it), so none is forgotten.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from cluster_support import local_cluster
from testkit import REPO_ROOT
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.zk.cluster import read_server_descriptors
from waltz_engine.zk.connection import connect

EXAMPLE_STORAGE = REPO_ROOT / "examples" / "storage"
EXAMPLE_SEGMENT = EXAMPLE_STORAGE / "1" / "0000000000000000042.seg"
FRAME_HEX = "4c0000000000210000000001000000020000000300000004ffffffffffffffff0000000000000000"
SNAKE_CASE_KEY = re.compile(r"^[a-z0-9_]+$|^[^A-Za-z]*$")

# Commands with --json that this module does not run, and where their JSON is tested instead.
NOT_RUN_HERE = {
    "waltz acl grant": "needs an mTLS cluster: tests/auth/test_auth_cluster.py",
    "waltz acl revoke": "needs an mTLS cluster: tests/auth/test_auth_cluster.py",
    "waltz acl list": "needs an mTLS cluster: tests/auth/test_auth_cluster.py",
    "waltz smoke": "minutes long: tests/smoke/test_smoke_run.py",
    "waltz sim": "runs simulated clusters: tests/sim/test_world.py",
    "waltz spark export": "starts Spark: tests/spark/test_spark_export_cluster.py",
    "waltz bench engine": "a benchmark: tests/bench/",
    "waltz bench crc": "a benchmark: tests/bench/",
    "waltz bench floor": "a benchmark: tests/bench/test_bench_floor.py",
    "waltz cluster under-replicated": "needs a cluster: tests/operator/test_operator_under_replicated.py",
    "waltz bench storage": "a benchmark: tests/bench/",
    "waltz bench producers": "a benchmark: tests/bench/test_bench_clients.py",
    "waltz bench consumers": "a benchmark: tests/bench/test_bench_clients.py",
    "waltz bench export": "starts Spark: tests/bench/test_bench_export.py",
    "waltz bench compare": "needs two saved reports: tests/bench/test_bench_compare.py",
    "waltz storage recover-partition": "needs an offline replica: tests/storage_admin/",
    "waltz storage decommission": "moves replicas: tests/nodes/",
    "waltz truncate": "cuts a replica offline: tests/operator/",
    "waltz create-cluster": "creates a cluster: tests/zk/test_zk_cli.py",
    "waltz zk auto-assign": "needs a group with no assignments: tests/zk/test_zk_cli.py",
    "waltz dev up": "starts a cluster of its own: tests/devcluster/",
    "waltz backup create": "backs up a cluster: tests/backup/test_backup_cluster.py",
    "waltz backup verify": "needs a backup: tests/backup/test_backup_cluster.py",
    "waltz backup restore": "needs a backup: tests/backup/test_backup_cluster.py",
    "waltz backup list": "needs a backup: tests/backup/test_backup_cluster.py",
}


def json_commands() -> set[str]:
    found: set[str] = set()

    def walk(command: Any, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        elif any("--json" in p.opts for p in command.params):
            found.add(" ".join(path))

    walk(typer.main.get_command(app), ("waltz",))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Its own embedded ZooKeeper, so that `zk status` has one to report on.
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=4) as c:
        appended = CliRunner().invoke(
            app, ["append", "-p", "0", "json test", "-c", str(c.client_config_path)]
        )
        assert appended.exit_code == 0, appended.output
        yield c


def runs(cluster: LocalCluster, scratch: Path) -> dict[str, list[str]]:
    """Each data-printing command, as a user would run it against this cluster."""
    cfg = ["-c", str(cluster.client_config_path)]
    storage = cluster.storages[0]
    server = cluster.servers[0]
    with connect(cluster.zookeeper_settings()) as client:
        server_id = read_server_descriptors(client, cluster.cluster_root)[0].server_id
    stopped_copy = scratch / "storage-copy"  # `storage checksum` reads a stopped node's files
    shutil.copytree(storage.directory / "data", stopped_copy)
    return {
        "waltz append": ["append", "-p", "0", "json test", "--json", *cfg],
        "waltz tail": ["tail", "-p", "0", "--no-follow", "--data", "--json", *cfg],
        "waltz client high-water-mark": ["client", "high-water-mark", "-p", "0", "--json", *cfg],
        "waltz top": ["top", "--once", "--json", *cfg, "--http", f"127.0.0.1:{server.jetty_port}"],
        "waltz recover": ["recover", "-p", "1", "--json", *cfg],
        "waltz inspect frame": ["inspect", "frame", FRAME_HEX, "--json"],
        "waltz inspect control": ["inspect", "control", str(EXAMPLE_STORAGE), "--json"],
        "waltz inspect segment": ["inspect", "segment", str(EXAMPLE_SEGMENT), "--max", "2", "--json"],
        "waltz inspect verify": ["inspect", "verify", str(EXAMPLE_STORAGE), "--json"],
        "waltz inspect stats": ["inspect", "stats", str(EXAMPLE_STORAGE), "--json"],
        "waltz zk status": ["zk", "status", "--dir", str(cluster.directory / "zookeeper"), "--json"],
        "waltz zk list": ["zk", "list", "--json", *cfg],
        "waltz zk show-cluster-key": ["zk", "show-cluster-key", "--json", *cfg],
        "waltz storage list": ["storage", "list", "--json", *cfg],
        "waltz storage sync-partitions": ["storage", "sync-partitions", "--json", *cfg],
        "waltz storage validate": ["storage", "validate", "--json", *cfg],
        "waltz storage max-transaction-id": [
            "storage",
            "max-transaction-id",
            "-s",
            storage.connect_string,
            "-p",
            "0",
            "--json",
            *cfg,
        ],
        "waltz storage checksum": ["storage", "checksum", str(stopped_copy), "--json", *cfg],
        "waltz server list": ["server", "list", "--http", f"127.0.0.1:{server.jetty_port}", "--json"],
        "waltz server add-preferred-partition": [
            "server",
            "add-preferred-partition",
            "--server",
            server.connect_string,
            "-p",
            "2",
            "--json",
            *cfg,
        ],
        "waltz server remove-preferred-partition": [
            "server",
            "remove-preferred-partition",
            "--server",
            server.connect_string,
            "-p",
            "2",
            "--json",
            *cfg,
        ],
        "waltz server assign": ["server", "assign", "-p", "3", "--server", str(server_id), "--json", *cfg],
        "waltz server unassign": ["server", "unassign", "-p", "3", "--json", *cfg],
        "waltz cluster check-connectivity": ["cluster", "check-connectivity", "--json", *cfg],
        "waltz cluster verify": ["cluster", "verify", "--json", *cfg],
        "waltz dev status": ["dev", "status", "--dir", str(cluster.directory), "--json"],
        "waltz retention show": ["retention", "show", "--json", *cfg],
    }


def snake_case_keys(value: Any, where: str) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            assert SNAKE_CASE_KEY.match(str(key)), f"{where}: key {key!r} is not snake_case"
            snake_case_keys(inner, where)
    elif isinstance(value, list):
        for inner in value:
            snake_case_keys(inner, where)


def test_every_json_command_is_run_here_or_elsewhere() -> None:
    listed = set(NOT_RUN_HERE) | set(RUN_NAMES)
    assert json_commands() == listed, f"added or gone: {sorted(json_commands() ^ listed)}"


RUN_NAMES = [
    "waltz append", "waltz tail", "waltz client high-water-mark", "waltz top", "waltz recover",
    "waltz inspect frame", "waltz inspect control", "waltz inspect segment", "waltz inspect verify",
    "waltz inspect stats", "waltz zk status", "waltz zk list", "waltz zk show-cluster-key",
    "waltz storage list", "waltz storage sync-partitions", "waltz storage validate",
    "waltz storage max-transaction-id", "waltz storage checksum", "waltz server list",
    "waltz server add-preferred-partition", "waltz server remove-preferred-partition",
    "waltz server assign", "waltz server unassign", "waltz cluster check-connectivity",
    "waltz cluster verify", "waltz dev status", "waltz retention show",
]  # fmt: skip


@pytest.mark.parametrize("name", RUN_NAMES)
def test_json_output_parses(cluster: LocalCluster, name: str, tmp_path: Path) -> None:
    every_run = runs(cluster, tmp_path)
    assert set(every_run) == set(RUN_NAMES)
    argv = every_run[name]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, f"`waltz {' '.join(argv)}` exit {result.exit_code}: {result.output}"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"`{name} --json` printed nothing"
    try:
        documents = [json.loads(result.stdout)]
    except json.JSONDecodeError:
        documents = [json.loads(line) for line in lines]  # JSON lines: one document per line
    for document in documents:
        assert isinstance(document, (dict, list, int, str)), document
        snake_case_keys(document, name)
    if name == "waltz tail":
        appended = [d for d in documents if d.get("data") == "json test"]
        assert appended, f"tail --json shows no data as text: {documents[-3:]}"
        assert appended[0]["partition"] == 0
        assert appended[0]["data_hex"] == b"json test".hex()
