"""`waltz storage <admin command> -c FILE` against a storage node that requires client
certificates: the ``ssl.*`` keys of FILE are used (as the original's StorageCli reads them), and
without them the error says why the connection ended (never an empty reason)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cert_support import make_cert
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from storage_node_support import StorageNodeProcess, create_test_cluster
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.zk import store_metadata
from waltz_engine.zk.connection import ZooKeeperSettings, connect

NUM_PARTITIONS = 1
QUICK_TIMEOUT_MS = "5000"
READY_LINE = "storage node ready"
READY_TIMEOUT_S = 60.0
POLL_S = 0.1


def _write_pem(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Path:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key_pem)
    return path


@pytest.fixture(scope="module")
def configs(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A storage node that accepts only certificates of a test CA, and two tool configs: one
    with such a certificate under ``ssl.*``, one without."""
    work = tmp_path_factory.mktemp("storage-tls")
    ca_key, ca = make_cert("waltz-test-ca", None, None, True)
    ca_path = work / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    storage_pem = _write_pem(work / "storage.pem", *make_cert("storage", ca_key, ca.subject, False))
    tool_pem = _write_pem(work / "tool.pem", *make_cert("tool", ca_key, ca.subject, False))
    root, key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    tls = {"storage.ssl.keyStore.location": str(storage_pem), "storage.ssl.trustStore.location": str(ca_path)}
    node = StorageNodeProcess(
        zookeeper, root, key, NUM_PARTITIONS, work / "node", jetty=False, extra_config=tls
    )
    try:
        # Its readiness probe has no certificate: the node's own line says when it listens.
        node.start(wait=False)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while READY_LINE not in node.log_text():
            assert node.running and time.monotonic() < deadline, node.log_text()
            time.sleep(POLL_S)
        with connect(ZooKeeperSettings(zookeeper, root)) as client:
            store_metadata.add_storage_node(client, root, f"{node.host}:{node.port}", 0, node.admin_port)
        where = {"zookeeper.connectString": zookeeper, "cluster.root": root}
        with_key = {**where, "ssl.keyStore.location": str(tool_pem), "ssl.trustStore.location": str(ca_path)}
        (work / "with-key.yml").write_text(yaml.safe_dump(with_key), encoding="utf-8")
        (work / "without-key.yml").write_text(yaml.safe_dump(where), encoding="utf-8")
        yield {"with": work / "with-key.yml", "without": work / "without-key.yml"}
    finally:
        node.close()


def test_admin_commands_use_the_ssl_keys_of_the_config(configs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["storage", "list", "-c", str(configs["with"]), "--json"])
    assert result.exit_code == 0, result.output
    assert "nodes" in result.stdout


def test_a_refused_client_gets_an_error_with_a_reason(configs: dict[str, Path]) -> None:
    result = CliRunner().invoke(
        app, ["storage", "list", "-c", str(configs["without"]), "--timeout-ms", QUICK_TIMEOUT_MS]
    )
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not lines[0].rstrip(")").rstrip().endswith(":"), lines[0]  # "connection lost: " and nothing
