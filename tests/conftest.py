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
