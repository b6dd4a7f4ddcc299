"""Plain helpers shared by tests: import them with ``from testkit import ...``.

They live here, not in conftest.py, because conftest modules are pytest's to import: a
second conftest.py anywhere in the tree would shadow ``import conftest``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from waltz_engine.ops.devcluster.nodes import PORT_RANGE_ENV, free_port, port_range

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


def free_tcp_port() -> int:
    """A port nothing listens on right now, outside the ephemeral range when it is known."""
    return free_port()


TEST_PORTS = (10_000, 32_000)  # below Linux's default ephemeral range (32768-60999)
# Set beside the slice to the worker that made it: a process a worker starts inherits both, and
# a second slicing there cut the slice again (10000-12000 became 10000-10125 in the children of
# four workers, and 165 tests found no free port).
PORT_SLICE_OF_ENV = "WALTZ_TEST_PORT_SLICE_OF"


def slice_port_range_for_worker(environ: MutableMapping[str, str]) -> None:
    """Each pytest-xdist worker (and what it starts) picks listening ports from its own slice:
    two workers picking at random from one range handed out the same port (a node then exited
    with "address already in use"). A range the run was given (WALTZ_PORT_RANGE, which keeps it
    apart from other runs on the machine) is sliced the same way: its workers used to share it
    whole, and a storage node whose ports were picked before it waited seconds for ZooKeeper
    found one taken by the other worker (1 failure in 4 runs of tests/storage_node, -n 2)."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    count = int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or environ.get(PORT_SLICE_OF_ENV) == worker:
        return
    low, high = port_range(environ) or TEST_PORTS
    width = (high - low) // count
    assert width > 0, f"{PORT_RANGE_ENV}={low}-{high} has fewer ports than its {count} workers"
    start = low + int(worker[2:]) * width
    environ[PORT_RANGE_ENV] = f"{start}-{start + width}"
    environ[PORT_SLICE_OF_ENV] = worker


def unique_cluster_root(name: str = "cluster") -> str:
    """A cluster root no other test uses, so tests can share the session's ZooKeeper."""
    return f"/test-{uuid.uuid4().hex[:16]}/{name}"
