"""Fixtures shared by every test: the golden vectors and one real ZooKeeper per session (per
pytest-xdist worker under `-n`, each with temporary directories of its own).

Plain helpers are in testkit.py; they are re-exported here only for older imports.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit import free_tcp_port, read_jsonl, unique_cluster_root, vectors_dir

__all__ = ["free_tcp_port", "read_jsonl", "unique_cluster_root", "vectors_dir"]


@pytest.fixture(scope="session")
def vectors() -> Path:
    return vectors_dir()


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `timeout`, `kill`) unwinds like Ctrl-C, so the
    # session's fixtures stop what they started (ZooKeeper, nodes) instead of leaving it running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Connect string (127.0.0.1:PORT) of a real ZooKeeper started for this test session (worker)."""
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
def zk_client(zookeeper: str, cluster_root: str) -> Iterator[Any]:
    """A connected kazoo client on the session's ZooKeeper (closed after the test)."""
    from waltz_engine.zk.connection import ZooKeeperSettings, connect

    with connect(ZooKeeperSettings(zookeeper, cluster_root)) as client:
        yield client
