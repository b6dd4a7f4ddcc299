"""A node process profiled on request (``WALTZ_PROFILE_DIR``), for measurements (issue 33)."""

from __future__ import annotations

import os
import pstats
import threading
from pathlib import Path

import pytest

from waltz_engine.common.profiling import PROFILE_DIR_ENV, PROFILE_NODES_ENV, profile_path, run_profiled


def _in_a_thread() -> int:
    return 7


def _node() -> int:
    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(_in_a_thread()))
    thread.start()
    thread.join()
    return results[0] + 1


def test_a_profiled_node_writes_the_calls_of_all_its_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(PROFILE_NODES_ENV, "storage, server")
    assert run_profiled("server", _node) == 8
    path = tmp_path / f"server-{os.getpid()}.pstats"
    names = {function for _, _, function in pstats.Stats(str(path)).stats}  # type: ignore[attr-defined]
    assert {"_node", "_in_a_thread"} <= names


def test_nodes_are_not_profiled_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)
    assert profile_path("server") is None
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(PROFILE_NODES_ENV, raising=False)
    assert profile_path("storage") is None  # the server only, by default
    assert run_profiled("storage", _node) == 8
    assert list(tmp_path.iterdir()) == []
