"""Process lifecycle of `waltz storage start`: signals, the directory lock, config errors, ports
in use, a Java key store."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from storage_node_support import (
    StorageNodeProcess,
    create_test_cluster,
    free_tcp_port,
    make_records,
    run_waltz,
    start_storage_node,
)

from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.storage.admin_client import StorageAdminClient


def _one_line_error(stderr: str) -> str:
    """The single `error: ...` line, after checking there is no traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_signal_exits_zero_and_releases_the_lock(zookeeper: str, tmp_path: Path, sig: int) -> None:
    node = start_storage_node(zookeeper, tmp_path, 2)
    try:

        async def write() -> None:
            client = node.data_client()
            await client.open()
            await client.append(-1, 1, make_records(0, 7, 1))
            await client.close()

        node.run(write())
        assert node.terminate(sig) == 0, node.log_text()
        assert "storage node stopped" in node.log_text()
        node.start()  # same directory: the lock was released

        async def read() -> list[Any]:
            client = node.data_client()
            await client.open()
            try:
                return await client.records(-1, 1, 0, 100)
            finally:
                await client.close()

        assert node.run(read()) == make_records(0, 7, 1)
        assert node.terminate() == 0
    finally:
        node.close()


def test_second_node_on_same_directory_is_refused(zookeeper: str, tmp_path: Path) -> None:
    first = start_storage_node(zookeeper, tmp_path / "first", 1)
    try:
        config = yaml.safe_load(first.config_path.read_text())
        config["storage.port"], config["storage.admin.port"] = free_tcp_port(), free_tcp_port()
        config["storage.jetty.port"] = free_tcp_port()
        second = tmp_path / "second.yml"
        second.write_text(yaml.safe_dump(config))
        result = run_waltz("storage", "start", "--config", str(second))
        assert result.returncode == 1
        line = _one_line_error(result.stderr)
        assert "is in use by another process" in line and str(first.directory) in line
        assert first.running
        first.run(first.with_admin(lambda a: a.assigned_partition_status()))  # still serving
    finally:
        first.close()


def _base_config(zookeeper: str, root: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "storage": {
            "port": free_tcp_port(),
            "admin": {"port": free_tcp_port()},
            "directory": str(tmp_path / "d"),
        },
        "zookeeper.connectString": zookeeper,
        "zookeeper.sessionTimeout": 10_000,
        "cluster.root": root,
    }


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c["storage"].pop("port"), "missing required key 'storage.port'"),
        (lambda c: c.pop("cluster.root"), "missing required key 'cluster.root'"),
        (lambda c: c["storage"].update(port="eighty"), "key 'storage.port' must be a 32-bit integer"),
        (lambda c: c["storage"].update(port=70000), "must be a port in"),
        (lambda c: c["storage"]["admin"].update(port=c["storage"]["port"]), "must all be different ports"),
        (lambda c: c.update({"storage.segment.size.threshold": 0}), "must be positive"),
        (lambda c: c.update({"cluster.root": "/no/such/cluster"}), "no cluster at /no/such/cluster"),
        (lambda c: c.update({"storage.ssl.keyStore.location": "/nonexistent.pem"}), "cannot read key store"),
    ],
    ids=["no-port", "no-root", "bad-port", "port-range", "same-ports", "threshold", "no-cluster", "tls"],
)
def test_config_errors_are_one_line(zookeeper: str, tmp_path: Path, change: Any, expected: str) -> None:
    root, _ = create_test_cluster(zookeeper, 1)
    config = _base_config(zookeeper, root, tmp_path)
    change(config)
    path = tmp_path / "storage.yml"
    path.write_text(yaml.safe_dump(config))
    result = run_waltz("storage", "start", "--config", str(path))
    assert result.returncode == 1
    assert expected in _one_line_error(result.stderr)


def test_missing_config_file_and_unknown_keys(zookeeper: str, tmp_path: Path) -> None:
    result = run_waltz("storage", "start", "--config", str(tmp_path / "absent.yml"))
    assert result.returncode == 1
    assert "config file not found" in _one_line_error(result.stderr)

    root, key = create_test_cluster(zookeeper, 1)
    node = StorageNodeProcess(
        zookeeper, root, key, 1, tmp_path / "n", extra_config={"storage.colour": "blue"}
    )
    try:
        node.start()
        warnings = [line for line in node.log_text().splitlines() if "storage.colour" in line]
        assert len(warnings) == 1 and "unknown config key" in warnings[0]
        ready = [line for line in node.log_text().splitlines() if "storage node ready" in line]
        assert (
            len(ready) == 1
            and f"data port {node.port}" in ready[0]
            and f"admin port {node.admin_port}" in ready[0]
        )
        assert node.terminate() == 0
    finally:
        node.close()


@pytest.mark.parametrize(
    ("port_key", "where"),
    [
        ("storage.port", lambda c: c["storage"]),
        ("storage.admin.port", lambda c: c["storage"]["admin"]),
        ("storage.jetty.port", lambda c: c["storage"]["jetty"]),
    ],
    ids=["data", "admin", "jetty"],
)
def test_port_in_use_leaves_a_new_directory_as_it_was(
    zookeeper: str, tmp_path: Path, port_key: str, where: Any
) -> None:
    root, _ = create_test_cluster(zookeeper, 1)
    config = _base_config(zookeeper, root, tmp_path)
    config["storage"]["host"] = "127.0.0.1"
    config["storage"]["jetty"] = {"port": free_tcp_port()}
    directory = tmp_path / "d"
    directory.mkdir()
    path = tmp_path / "storage.yml"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        where(config)["port"] = port
        path.write_text(yaml.safe_dump(config))
        result = run_waltz("storage", "start", "--config", str(path))
    assert result.returncode == 1, result.stderr
    line = _one_line_error(result.stderr)
    assert f"127.0.0.1:{port}" in line and port_key in line and "already in use" in line, line
    assert list(directory.iterdir()) == []  # no waltz-storage.ctl, nothing else


JKS_PASSWORD = "store-secret"


@pytest.fixture(scope="module")
def node_jks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JKS key store as a Java node's: one self-signed RSA key pair, made by keytool."""
    store = tmp_path_factory.mktemp("jks") / "node.jks"
    result = subprocess.run(
        ["keytool", "-J-XX:TieredStopAtLevel=1", "-genkeypair", "-alias", "node", "-keyalg", "RSA",
         "-keysize", "2048", "-dname", "CN=waltz-storage", "-validity", "2", "-storetype", "JKS",
         "-keystore", str(store), "-storepass", JKS_PASSWORD, "-keypass", JKS_PASSWORD],
        capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return store


def test_node_serves_with_a_jks_key_store(zookeeper: str, tmp_path: Path, node_jks: Path) -> None:
    """`storage.ssl.keyStore.*` as a Java cluster's (no type key: JKS, the original's default);
    a tool trusting that JKS (as its trust store) verifies the node's certificate."""
    root, key = create_test_cluster(zookeeper, 1)
    tls = {"storage.ssl.keyStore.location": str(node_jks), "storage.ssl.keyStore.password": JKS_PASSWORD}
    node = StorageNodeProcess(zookeeper, root, key, 1, tmp_path / "n", extra_config=tls)
    try:
        node.start()
        trusting = client_context(
            TlsConfig(trust_store_location=str(node_jks), trust_store_password=JKS_PASSWORD)
        )

        async def status() -> object:
            admin = StorageAdminClient(node.host, node.admin_port, trusting, key, 1)
            await admin.open()
            try:
                return await admin.assigned_partition_status()
            finally:
                await admin.close()

        assert node.run(status()) is not None
        assert node.terminate() == 0
    finally:
        node.close()


def test_jks_wrong_password_is_one_line(zookeeper: str, tmp_path: Path, node_jks: Path) -> None:
    root, _ = create_test_cluster(zookeeper, 1)
    config = _base_config(zookeeper, root, tmp_path)
    config["storage.ssl.keyStore.location"] = str(node_jks)
    config["storage.ssl.keyStore.password"] = "not-the-password"
    config["storage.ssl.keyStore.type"] = "JKS"
    path = tmp_path / "storage.yml"
    path.write_text(yaml.safe_dump(config))
    result = run_waltz("storage", "start", "--config", str(path))
    assert result.returncode == 1, result.stderr
    line = _one_line_error(result.stderr)
    assert f"JKS key store {node_jks}" in line and "check keyStore.password" in line, line
    assert not (tmp_path / "d").exists()
