"""`waltz dev` is safe on a user's directories and ports (issue 11 §4), with real processes.

`dev up` refuses a non-empty directory it did not make; `dev down --clean` removes only what
`dev up` made; an `up` that fails half way stops every process it started and says which port;
`dev status` says in words when ZooKeeper is down.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from cluster_support import run_waltz_cli

from waltz_engine.ops.devcluster import (
    PORTS_PER_SERVER,
    PORTS_PER_STORAGE,
    STATE_FILE_NAME,
    DevClusterError,
    LocalCluster,
)

SMALL = ("--storages", "1", "--servers", "0", "--partitions", "1")
PORT_RANGE_ATTEMPTS = 50
MAX_PORT = 65535


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return line


def test_up_refuses_a_non_empty_directory_it_did_not_make(tmp_path: Path) -> None:
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    line = one_error_line(run_waltz_cli("dev", "up", "--detach", "--dir", str(mine), *SMALL))
    assert f"{mine.resolve()} is not empty and holds no local cluster" in line
    assert "give a new or empty directory" in line
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # nothing written, nothing started
    assert (mine / "notes.txt").read_text() == "mine\n"

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert "is not a directory" in one_error_line(run_waltz_cli("dev", "up", "--detach", "-d", str(a_file)))


def test_down_clean_removes_only_what_up_made_and_status_says_zookeeper_is_down(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    directory.mkdir()  # the user's (empty) directory: `up` may use it, but not remove it
    try:
        run_ok = run_waltz_cli("dev", "up", "--detach", "--json", "--dir", str(directory), *SMALL)
        assert run_ok.returncode == 0, run_ok.stderr
        ready = json.loads(run_ok.stdout)  # --json: the status, once ready, as one document
        assert ready["healthy"] and ready["zookeeper"]["running"]
        assert [n["name"] for n in ready["nodes"]] == ["storage-0"]
        made = sorted(p.name for p in directory.iterdir())
        (directory / "notes.txt").write_text("mine\n")  # a user's file beside the cluster's
        (directory / "keep").mkdir()
        (directory / "keep" / "data").write_text("mine too\n")

        # ZooKeeper alone goes down: status says so in words, exit 1, no traceback.
        zookeeper = LocalCluster.open(directory).embedded_zookeeper
        assert zookeeper is not None and zookeeper.stop()
        status = run_waltz_cli("dev", "status", "--dir", str(directory))
        assert status.returncode == 1 and "Traceback" not in status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].split()[:2] == ["zookeeper", "down"], status.stdout
        assert f"ZooKeeper at {zookeeper.connect_string} is down" in lines[-1], status.stdout
        assert f"waltz dev up --detach --dir {directory}" in lines[-1]
        as_json = json.loads(run_waltz_cli("dev", "status", "--json", "--dir", str(directory)).stdout)
        assert as_json["zookeeper"] == {"connect_string": zookeeper.connect_string, "running": False}
        assert {"cluster_root", "client_config"} <= set(as_json)

        down = run_waltz_cli("dev", "down", "--dir", str(directory))
        assert down.returncode == 0, down.stderr
        everything_down = run_waltz_cli("dev", "status", "--dir", str(directory))
        assert everything_down.returncode == 1
        assert everything_down.stdout.splitlines()[-1].startswith(
            "the cluster is down (ZooKeeper and every node)"
        )
    finally:
        cleaned = run_waltz_cli("dev", "down", "--clean", "--dir", str(directory))
    assert cleaned.returncode == 0, cleaned.stderr
    assert "kept what `dev up` did not make: keep, notes.txt" in cleaned.stdout
    assert {STATE_FILE_NAME, "client.yml", "zookeeper", "storage-0"} <= set(made)
    assert sorted(p.name for p in directory.iterdir()) == ["keep", "notes.txt"]
    assert (directory / "notes.txt").read_text() == "mine\n"
    assert (directory / "keep" / "data").read_text() == "mine too\n"


def test_down_clean_removes_a_directory_up_made_only_when_nothing_else_is_in_it(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "new", 1, 0, 1)
    cluster._claim_directory()
    cluster._save_state()  # what `up` writes first; nothing is started
    (cluster.directory / "notes.txt").write_text("mine\n")
    LocalCluster.open(cluster.directory).down(clean=True)
    assert sorted(p.name for p in cluster.directory.iterdir()) == ["notes.txt"]
    (cluster.directory / "notes.txt").unlink()
    cluster._save_state()
    LocalCluster.open(cluster.directory).down(clean=True)
    assert not cluster.directory.exists()


def _port_range(count: int) -> int:
    """A first port of ``count`` consecutive ports that are free now."""
    for _ in range(PORT_RANGE_ATTEMPTS):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first: int = probe.getsockname()[1]
        if first + count > MAX_PORT:
            continue
        try:
            with ExitStack() as stack:  # all bound at once: each is free
                for port in range(first, first + count):
                    stack.enter_context(_listening(port))
        except OSError:
            continue
        return first
    raise AssertionError("no free port range")


@contextmanager
def _listening(port: int) -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


def test_a_port_in_use_is_named_and_nothing_is_left_running(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    base = _port_range(1 + PORTS_PER_STORAGE + PORTS_PER_SERVER)
    server_port = base + 1 + PORTS_PER_STORAGE  # ZooKeeper, then storage-0's three, then server-0's
    topology = ("--storages", "1", "--servers", "1", "--partitions", "1", "--base-port", str(base))
    try:
        with _listening(server_port):
            line = one_error_line(run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), *topology))
        assert line == (
            f"error: port {server_port} (server-0 client port) is in use by another process: "
            "stop that process, or start the cluster in another directory (other ports)"
        )
        cluster = LocalCluster.open(directory)
        assert not cluster.is_running()
        assert [n.ports["port"] for n in cluster.servers] == [server_port]
    finally:
        run_waltz_cli("dev", "down", "--clean", "--dir", str(directory))
    assert not directory.exists()


def test_an_up_that_fails_half_way_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper and a storage node start; the other storage node cannot: both are stopped."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where storage-1's data directory should be")
    cluster = LocalCluster(tmp_path / "dev", storages=2, servers=0, partitions=1)
    # storage-1 fails at startup (its data directory is a file); storage-0 starts normally.
    cluster._claim_directory()
    monkeypatch.setattr(cluster, "_write_yaml", _failing_second_storage(cluster._write_yaml, blocked))
    try:
        with pytest.raises(DevClusterError) as failed:
            cluster.up(60_000)
        message = str(failed.value)
        assert "\n" not in message
        assert message.startswith("storage-1 exited during startup: "), message
        assert not cluster.is_running()  # storage-0 and ZooKeeper stopped again
        assert all(n.pid is None for n in LocalCluster.open(cluster.directory).nodes)
        embedded = cluster.embedded_zookeeper
        assert embedded is not None and not embedded.is_running()
    finally:
        cluster.down(clean=True)


def _failing_second_storage(
    write_yaml: Callable[[Path, dict[str, Any]], None], blocked: Path
) -> Callable[[Path, dict[str, Any]], None]:
    def write(path: Path, config: dict[str, Any]) -> None:
        if path.parent.name == "storage-1":
            config = {**config, "storage.directory": str(blocked / "data")}
        write_yaml(path, config)

    return write
