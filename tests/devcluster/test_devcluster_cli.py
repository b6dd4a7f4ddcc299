"""`waltz dev up | status | down` with real processes."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import yaml
from cluster_support import run_waltz_cli, waltz_cli_command

from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.cluster_ops import read_cluster_view, verify
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.devcluster.nodes import ZOOKEEPER_DIR_NAME
from waltz_engine.zk import store_metadata
from waltz_engine.zk.connection import connect
from waltz_engine.zk.server import PID_FILE_NAME

READY_LINE_WAIT_S = 120.0
PROCESS_EXIT_TIMEOUT_S = 60.0
POLL_S = 0.05


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def verify_passes(directory: Path) -> bool:
    cluster = LocalCluster.open(directory)
    with connect(cluster.zookeeper_settings()) as zk:
        view = read_cluster_view(zk, cluster.cluster_root)
    return asyncio.run(verify(view, client_context(TlsConfig()))).passed


def test_up_detach_status_down_and_up_again_reuses_data(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    topology = ["--storages", "2", "--servers", "1", "--partitions", "2"]
    try:
        out = ok(run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), *topology))
        assert f"client      {directory / 'client.yml'}" in out
        assert verify_passes(directory)
        status = json.loads(ok(run_waltz_cli("dev", "status", "--json", "--dir", str(directory))))
        assert status["healthy"] and [n["name"] for n in status["nodes"]] == [
            "storage-0",
            "storage-1",
            "server-0",
        ]

        config = ["--config", str(directory / "client.yml")]
        txid = ok(run_waltz_cli("append", "-p", "1", "kept", *config)).split()[-1]
        ok(run_waltz_cli("dev", "down", "--dir", str(directory)))
        stopped = run_waltz_cli("dev", "status", "--json", "--dir", str(directory))
        assert stopped.returncode == 1
        assert not any(n["running"] for n in json.loads(stopped.stdout)["nodes"])

        mismatch = run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), "--storages", "3")
        assert mismatch.returncode == 1 and "holds a cluster of 2 storage nodes" in mismatch.stderr

        ok(run_waltz_cli("dev", "up", "--detach", "--dir", str(directory)))  # topology from the saved state
        again = json.loads(ok(run_waltz_cli("dev", "status", "--json", "--dir", str(directory))))
        assert [n["ports"] for n in again["nodes"]] == [n["ports"] for n in status["nodes"]]
        assert again["zookeeper"] == status["zookeeper"]
        tailed = ok(run_waltz_cli("tail", "-p", "1", "--no-follow", "--json", "--data", *config))
        assert [json.loads(line)["data_hex"] for line in tailed.splitlines()] == [b"kept".hex()]
        assert json.loads(tailed)["transaction_id"] == int(txid)
    finally:
        run_waltz_cli("dev", "down", "--clean", "--dir", str(directory))
    assert not directory.exists()


def _read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def _stop(up: subprocess.Popen[str], directory: Path) -> None:
    """Whatever the test's end: no `dev up` left running, nor anything it started."""
    if up.poll() is None:
        up.kill()
        up.wait(PROCESS_EXIT_TIMEOUT_S)
    LocalCluster.open(directory).down()


def test_foreground_up_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    directory = tmp_path / "fg"
    up = subprocess.Popen(
        waltz_cli_command("dev", "up", "--dir", str(directory),
         "--storages", "1", "--servers", "1", "--partitions", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(up.stdout, lines), daemon=True).start()
    try:
        try:
            while not lines.get(timeout=READY_LINE_WAIT_S).startswith("client "):
                pass
        except queue.Empty:
            up.kill()
            raise AssertionError(f"dev up never got ready: {up.communicate()[1]}") from None
        assert LocalCluster.open(directory).status().healthy
        # The relay in a terminal: the nodes are in their own sessions, only `up` gets SIGINT.
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(PROCESS_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            up.kill()
            raise AssertionError(f"dev up did not stop on SIGINT: {up.communicate()[1]}") from None
        assert code == 0, up.stderr.read() if up.stderr else ""
        assert not LocalCluster.open(directory).is_running()
    finally:
        _stop(up, directory)


SEGMENT_BYTES = 4096
RECORD_BYTES = 3000  # each record fills most of a segment, so three of them need three segments


def test_up_with_replicas_and_set_places_partitions_and_configures_every_node(tmp_path: Path) -> None:
    directory = tmp_path / "dev"
    topology = ["--storages", "3", "--servers", "1", "--partitions", "3", "--replicas", "2"]
    settings = ["--set", f"storage.segment.size.threshold={SEGMENT_BYTES}", "--set", "bogus.key=x"]
    settings += ["--set", "server.feedCacheSize=1234"]
    try:
        result = run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), *topology, *settings)
        ok(result)
        assert "--set bogus.key: no storage node or server knows this key" in result.stderr
        assert verify_passes(directory)
        cluster = LocalCluster.open(directory)
        with connect(cluster.zookeeper_settings()) as zk:
            assigned = store_metadata.read_replica_assignments(zk, cluster.cluster_root).as_dict()
        holders = [tuple(sorted(n for n, held in assigned.items() if p in held)) for p in range(3)]
        assert [len(nodes) for nodes in holders] == [2, 2, 2] and len(set(holders)) == 3  # spread
        # Each key goes only to the YAML of the node kind that reads it (the other would warn about
        # it); a key no node reads goes to both, whose warnings name it.
        for node in cluster.storages:
            written = yaml.safe_load(node.config_path.read_text(encoding="utf-8"))
            assert written["storage.segment.size.threshold"] == SEGMENT_BYTES and written["bogus.key"] == "x"
            assert "server.feedCacheSize" not in written
        for node in cluster.servers:
            written = yaml.safe_load(node.config_path.read_text(encoding="utf-8"))
            assert written["server.feedCacheSize"] == 1234 and written["bogus.key"] == "x"
            assert "storage.segment.size.threshold" not in written
        # A dev cluster's servers re-replicate a storage node lost for 10 s (issue 24).
        assert all(
            yaml.safe_load(node.config_path.read_text(encoding="utf-8"))["server.autoRecovery.graceMs"]
            == 10_000
            for node in cluster.servers
        )

        config = ["--config", str(directory / "client.yml")]
        ok(run_waltz_cli("append", "-p", "0", "-", *config, stdin=("x" * RECORD_BYTES + "\n") * 3))
        segments = {
            node.name: len(list((node.directory / "data").rglob("*.seg")))
            for node in cluster.storages
            if 0 in cluster.partitions_of(node)
        }
        assert len(segments) == 2 and all(count >= 3 for count in segments.values()), segments

        changed = run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), "--set", "bogus.key=y")
        assert changed.returncode == 1 and "stop the cluster (`waltz dev down`)" in changed.stderr
        other = run_waltz_cli("dev", "up", "--detach", "--dir", str(directory), "--replicas", "3")
        assert other.returncode == 1 and "on 2 replicas each, not 3/1/3 on 3" in other.stderr

        ok(run_waltz_cli("dev", "down", "--dir", str(directory)))
        ok(run_waltz_cli("dev", "up", "--detach", "--dir", str(directory)))  # keys and replicas as saved
        again = yaml.safe_load(cluster.storages[0].config_path.read_text(encoding="utf-8"))
        assert again["storage.segment.size.threshold"] == SEGMENT_BYTES
        tailed = ok(run_waltz_cli("tail", "-p", "0", "--no-follow", "--json", *config))
        assert len(tailed.splitlines()) == 3
    finally:
        run_waltz_cli("dev", "down", "--clean", "--dir", str(directory))


def test_set_refuses_what_dev_up_chooses_and_what_is_not_key_value(tmp_path: Path) -> None:
    for bad, reason in (
        ("storage.port=1", "storage.port is chosen by `dev up`"),
        ("storage.segment.size.threshold", "give KEY=VALUE"),
        ("storage.segment.size.threshold=[1, 2]", "the value must be one number, boolean or string"),
    ):
        result = run_waltz_cli("dev", "up", "--detach", "--dir", str(tmp_path / "dev"), "--set", bad)
        assert result.returncode == 2 and reason in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dev").exists()


def test_commands_find_the_dev_cluster_and_its_storage_directories(tmp_path: Path) -> None:
    """Next to `dev up` (its default directory name): `server list` needs no --http, `spark
    export` no -c, `dev status` names each storage directory and `inspect control` on a storage
    node's directory says where its storage directory is."""
    directory = tmp_path / ".waltz-dev"
    topology = ["--storages", "1", "--servers", "1", "--partitions", "1"]
    try:
        ok(run_waltz_cli("dev", "up", "--detach", *topology, cwd=tmp_path))
        status = ok(run_waltz_cli("dev", "status", cwd=tmp_path))
        storage_line = next(line for line in status.splitlines() if line.startswith("storage-0"))
        assert storage_line.endswith(f" data={directory.resolve() / 'storage-0' / 'data'}"), status
        servers = json.loads(ok(run_waltz_cli("server", "list", "--json", cwd=tmp_path)))
        assert servers["num_partitions"] == 1 and [p["partition"] for p in servers["partitions"]] == [0]

        control = run_waltz_cli("inspect", "control", str(directory / "storage-0"), cwd=tmp_path)
        assert control.returncode == 1 and control.stderr.count("\n") == 1
        assert control.stderr.rstrip().endswith(
            f"; the storage directory is {directory / 'storage-0' / 'data'}"
        )

        ok(run_waltz_cli("append", "-p", "0", "found", cwd=tmp_path))
        export = run_waltz_cli("spark", "export", "-o", str(tmp_path / "out"), "--json", cwd=tmp_path)
        assert json.loads(ok(export))["rows"] == 1
    finally:
        run_waltz_cli("dev", "down", "--clean", cwd=tmp_path)
    assert not directory.exists()
    nothing = run_waltz_cli("dev", "down", "--clean", cwd=tmp_path)
    assert nothing.returncode == 0 and nothing.stderr == ""
    assert nothing.stdout == "no dev cluster in .waltz-dev: nothing to stop\n"


def test_ctrl_c_while_a_detached_up_starts_stops_zookeeper(tmp_path: Path) -> None:
    directory = tmp_path / "early"
    up = subprocess.Popen(
        waltz_cli_command("dev", "up", "--detach", "--dir", str(directory),
                          "--storages", "1", "--servers", "1", "--partitions", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # ZooKeeper's pid file is written as it is launched; the JVM then takes seconds to answer.
        deadline = time.monotonic() + READY_LINE_WAIT_S
        pid_file = directory / ZOOKEEPER_DIR_NAME / PID_FILE_NAME
        while not pid_file.exists():
            assert up.poll() is None and time.monotonic() < deadline, up.communicate()
            time.sleep(POLL_S)
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=PROCESS_EXIT_TIMEOUT_S)
        assert (up.returncode, err) == (130, "error: interrupted\n")
        assert not LocalCluster.open(directory).is_running()
    finally:
        _stop(up, directory)


def test_the_docs_name_the_node_kind_that_reads_each_key() -> None:
    """docs/cli.md lists every key a storage node or a server reads under that kind (issue 31)."""
    from waltz_engine.server import config as server_config
    from waltz_engine.storage.node import config as storage_config

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Which node reads each key", 1)[1].split("\n## ", 1)[0]
    items = {line.split(":", 1)[0]: line for line in " ".join(section.split()).split("- ")[1:]}
    storage_line = next(v for k, v in items.items() if k.startswith("Storage nodes"))
    server_line = next(v for k, v in items.items() if k.startswith("Servers"))
    both_line = items["Both"]
    shared = set(storage_config.KNOWN_KEYS) & set(server_config.KNOWN_KEYS)
    for keys, prefixes, line in (
        (storage_config.KNOWN_KEYS, storage_config.KNOWN_PREFIXES, storage_line),
        (server_config.KNOWN_KEYS, server_config.KNOWN_PREFIXES, server_line),
    ):
        for key in keys:
            assert f"`{key}`" in (both_line if key in shared else line), key
        for prefix in prefixes:
            assert f"`{prefix}*`" in line, prefix
