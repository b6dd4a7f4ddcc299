"""Plain helpers shared by tests: import them with ``from testkit import ...``.

They live here, not in conftest.py, because conftest modules are pytest's to import: a
second conftest.py anywhere in the tree would shadow ``import conftest``.
"""

from __future__ import annotations

import json
import os
import random
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


VECTORS_DIR = REPO_ROOT / "tests" / "vectors"


def vectors_dir() -> Path:
    """The golden vectors made by Waltz 0.13.2: $WALTZ_VECTORS, else the project's copy in tests/vectors."""
    configured = os.environ.get("WALTZ_VECTORS")
    path = Path(configured) if configured else VECTORS_DIR
    if not (path / "SHA256SUMS").is_file():
        pytest.fail(f"golden vectors not found at {path}; set WALTZ_VECTORS to the vectors folder")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Ports for test listeners come from below the kernel's ephemeral range: a port bind(0) picks
# there can go to any process's outgoing connection before the node meant to listen on it
# starts (seen under load: a storage node exiting with "cannot listen on 127.0.0.1:45129
# ('storage.port'): address already in use").
_LISTEN_PORTS_FLOOR = 10_000
_ENOUGH_LISTEN_PORTS = 1_000
_pick = random.SystemRandom()  # not the seedable module RNG: parallel runs must not agree


def _ephemeral_floor() -> int | None:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_tcp_port() -> int:
    """A port nothing listens on right now, outside the ephemeral range when it is known."""
    floor = _ephemeral_floor()
    if floor is not None and floor - _LISTEN_PORTS_FLOOR >= _ENOUGH_LISTEN_PORTS:
        for _ in range(100):
            port = _pick.randrange(_LISTEN_PORTS_FLOOR, floor)
            if _port_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def unique_cluster_root(name: str = "cluster") -> str:
    """A cluster root no other test uses, so tests can share the session's ZooKeeper."""
    return f"/test-{uuid.uuid4().hex[:16]}/{name}"
