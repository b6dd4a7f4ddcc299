"""`waltz zk start --daemon / status / stop` with real ZooKeeper processes in a tmp dir."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from testkit import free_tcp_port
from typer.testing import CliRunner, Result

from waltz_cli.main import app
from waltz_engine.ops.devcluster import DEFAULT_DIRECTORY, ZOOKEEPER_DIR_NAME
from waltz_engine.zk import server
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.server import DEFAULT_DATA_DIR, DEV_DATA_DIR, EmbeddedZooKeeper, four_letter_word

runner = CliRunner()
EXIT_NOT_RUNNING = 3
ZK_TIMEOUT_MS = 10_000


STATUS_ATTEMPTS = 100
STATUS_PAUSE_S = 0.1


def _start_daemon(port: int, data_dir: Path) -> Result:
    return runner.invoke(app, ["zk", "start", "--port", str(port), "--dir", str(data_dir), "--daemon"])


def test_daemon_start_status_stop_round_trip(tmp_path: Path) -> None:
    port = free_tcp_port()
    data_dir = tmp_path / "zk"
    try:
        started = _start_daemon(port, data_dir)
        assert started.exit_code == 0, started.output
        assert four_letter_word("127.0.0.1", port, "ruok") == "imok"
        assert (data_dir / "zoo.cfg").is_file() and (data_dir / "zookeeper.log").is_file()

        # `ruok` answers before `srvr` knows the mode: asked again (bounded) until it does.
        for _ in range(STATUS_ATTEMPTS):
            status = runner.invoke(app, ["zk", "status", "--dir", str(data_dir), "--json"])
            assert status.exit_code == 0, status.output
            state = json.loads(status.stdout)
            if state["mode"] is not None:
                break
            time.sleep(STATUS_PAUSE_S)
        assert state["running"] and state["mode"] == "standalone"
        assert state["connect_string"] == f"127.0.0.1:{port}"
        assert state["data_dir"] == str(data_dir.resolve())
        text = runner.invoke(app, ["zk", "status", "-d", str(data_dir)])
        assert text.exit_code == 0 and text.stdout.startswith(f"running: ZooKeeper at 127.0.0.1:{port} ")
        assert state["pid"] == int((data_dir / "zookeeper.pid").read_text())

        again = _start_daemon(port, data_dir)
        assert again.exit_code == 1
        assert "already running" in again.stderr and "Traceback" not in again.output

        stopped = runner.invoke(app, ["zk", "stop", "--dir", str(data_dir)])
        assert stopped.exit_code == 0 and "stopped" in stopped.stdout
        assert four_letter_word("127.0.0.1", port, "ruok") is None
        assert not (data_dir / "zookeeper.pid").exists()

        after = runner.invoke(app, ["zk", "status", "--dir", str(data_dir)])
        assert after.exit_code == EXIT_NOT_RUNNING and "not running" in after.stdout
        # --data-dir, the old spelling, is a hidden alias of --dir.
        assert "not running" in runner.invoke(app, ["zk", "stop", "--data-dir", str(data_dir)]).stdout
    finally:
        EmbeddedZooKeeper(data_dir).stop()


def test_start_on_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _start_daemon(port, tmp_path)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: port {port} on 127.0.0.1 is already in use"
    assert not EmbeddedZooKeeper(tmp_path).is_running()


def test_missing_java_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    result = _start_daemon(free_tcp_port(), tmp_path / "zk")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: java not found: install Java 17")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(server.system_classpath() is None, reason="needs libzookeeper-java (.ci/run installs it)")
def test_without_pyspark_it_runs_from_the_system_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_pyspark_classpath", lambda: None)
    port = free_tcp_port()
    data_dir = tmp_path / "zk"
    try:
        started = _start_daemon(port, data_dir)
        assert started.exit_code == 0, started.output
        settings = ZooKeeperSettings(f"127.0.0.1:{port}", "/", ZK_TIMEOUT_MS, ZK_TIMEOUT_MS)
        with connect(settings) as zk:
            zk.create("/from-the-system-jars", b"yes")
            assert zk.get("/from-the-system-jars")[0] == b"yes"
        command_line = Path(f"/proc/{EmbeddedZooKeeper(data_dir).pid()}/cmdline").read_bytes()
        assert str(server.SYSTEM_JAVA_DIR / "zookeeper.jar").encode() in command_line
    finally:
        EmbeddedZooKeeper(data_dir).stop()


def test_without_any_zookeeper_jars_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_pyspark_classpath", lambda: None)
    monkeypatch.setattr(server, "SYSTEM_JAVA_DIR", tmp_path)
    result = _start_daemon(free_tcp_port(), tmp_path / "zk")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no ZooKeeper jars found: install the system package")
    assert "apt-get install libzookeeper-java" in result.stderr and "[spark]" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_stale_pid_file_is_not_mistaken_for_a_server(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path, free_tcp_port())
    server.pid_file.write_text("999999999\n")
    assert not server.is_running()
    assert not server.pid_file.exists()


def test_status_and_stop_find_the_dev_clusters_zookeeper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --dir: .waltz/zookeeper, unless it holds no ZooKeeper and .waltz-dev/zookeeper does."""
    monkeypatch.chdir(tmp_path)
    assert Path(DEFAULT_DIRECTORY) / ZOOKEEPER_DIR_NAME == DEV_DATA_DIR  # where `waltz dev up` puts it
    nothing = runner.invoke(app, ["zk", "status"])
    assert nothing.exit_code == EXIT_NOT_RUNNING
    assert nothing.stdout.strip() == f"not running: no ZooKeeper runs from {(tmp_path / DEFAULT_DATA_DIR)}"

    port = free_tcp_port()
    dev_dir = tmp_path / DEV_DATA_DIR
    try:
        started = _start_daemon(port, dev_dir)
        assert started.exit_code == 0, started.output
        (tmp_path / DEFAULT_DATA_DIR).mkdir(parents=True)  # an empty one does not hide the dev cluster's
        status = runner.invoke(app, ["zk", "status"])
        assert status.exit_code == 0, status.output
        assert status.stdout.startswith(f"running: ZooKeeper at 127.0.0.1:{port} ")
        assert f"data dir {dev_dir}" in status.stdout
        stopped = runner.invoke(app, ["zk", "stop"])
        assert stopped.exit_code == 0 and f"stopped ZooKeeper 127.0.0.1:{port} ({dev_dir})" in stopped.stdout
        assert four_letter_word("127.0.0.1", port, "ruok") is None
        # Stopped, the dev cluster's still holds a ZooKeeper: status says so, from there.
        after = runner.invoke(app, ["zk", "status"])
        assert after.exit_code == EXIT_NOT_RUNNING
        assert after.stdout.strip() == f"not running: no ZooKeeper runs from {dev_dir}"
    finally:
        EmbeddedZooKeeper(dev_dir).stop()
