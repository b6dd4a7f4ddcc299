"""Shared fixtures: where the original's golden vectors are."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def vectors_dir() -> Path:
    """The golden vectors made by Waltz 0.13.2: $WALTZ_VECTORS, else ../shared/vectors."""
    configured = os.environ.get("WALTZ_VECTORS")
    path = Path(configured) if configured else REPO_ROOT.parent / "shared" / "vectors"
    if not (path / "README.md").is_file():
        pytest.fail(f"golden vectors not found at {path}; set WALTZ_VECTORS to the vectors folder")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def vectors() -> Path:
    return vectors_dir()


# --- ZooKeeper: one real, embedded server per test session ------------------------------------


def free_tcp_port() -> int:
    """A port nothing listens on right now (the kernel picks it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unique_cluster_root(name: str = "cluster") -> str:
    """A cluster root no other test uses, so tests can share the session's ZooKeeper."""
    import uuid

    return f"/test-{uuid.uuid4().hex[:16]}/{name}"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Connect string (127.0.0.1:PORT) of a real ZooKeeper started for this test session."""
    from waltz_engine.zk.server import EmbeddedZooKeeper

    server = EmbeddedZooKeeper(tmp_path_factory.mktemp("zookeeper"), free_tcp_port())
    server.start()
    try:
        yield server.connect_string
    finally:
        server.stop()


@pytest.fixture
def cluster_root() -> str:
    return unique_cluster_root()


@pytest.fixture
def zk_client(zookeeper: str, cluster_root: str) -> Any:
    """A connected kazoo client on the session's ZooKeeper (closed after the test)."""
    from waltz_engine.zk.connection import ZooKeeperSettings, connect

    with connect(ZooKeeperSettings(zookeeper, cluster_root)) as client:
        yield client
