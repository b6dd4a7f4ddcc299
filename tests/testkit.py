"""Plain helpers shared by tests: import them with ``from testkit import ...``.

They live here, not in conftest.py, because conftest modules are pytest's to import: a
second conftest.py anywhere in the tree would shadow ``import conftest``.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from waltz_engine.ops.devcluster.nodes import free_port

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


def unique_cluster_root(name: str = "cluster") -> str:
    """A cluster root no other test uses, so tests can share the session's ZooKeeper."""
    return f"/test-{uuid.uuid4().hex[:16]}/{name}"
