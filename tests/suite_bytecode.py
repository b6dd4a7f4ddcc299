"""The suite's bytecode, compiled once per run by the controller before any worker starts.

With PYTHONDONTWRITEBYTECODE set (as on this project's machines and in CI) nothing writes
`__pycache__`, so every process would compile from source each module it imports:

- every node, `waltz` command and worker the suite starts, a few hundred in all, would compile
  the engine again: 0.2-0.3 s of CPU per node start. pip compiles the dependencies; these it
  installs editable, as source. ``compileall`` writes them.
- every worker would parse and rewrite each test module's asserts (pytest's own compilation,
  cached in ``*-pytest-*.pyc`` files it also does not write then): 8 of a worker's 12 s of CPU
  collecting the suite (measured), on each of the run's workers. pytest has no public call to
  write its cache; its own functions do it, and when they change this falls back to what pytest
  does anyway.
"""

from __future__ import annotations

import compileall
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRECTORIES = ("waltz_engine", "waltz_cli", "spark", "examples", "tests")
# Compiled in this many processes: the controller and one child (the CI machine has 2 cores).
PROCESSES = 2


def compile_suite(config: pytest.Config) -> None:
    for name in SOURCE_DIRECTORIES:
        compileall.compile_dir(ROOT / name, quiet=2, workers=PROCESSES)
    _rewrite_test_modules(config)


def _rewrite_test_modules(config: pytest.Config) -> None:
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
    except (ImportError, AttributeError, KeyError):  # another pytest, or `--assert=plain`
        return
    patterns = [*config.getini("python_files"), "conftest.py"]
    todo = [
        path
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if any(fnmatch(path.name, pattern) for pattern in patterns)
        and rewrite._read_pyc(path, _pyc(rewrite, path), _ignore) is None
    ]
    child = os.fork() if len(todo) > 1 else -1
    try:
        for path in todo[child == 0 :: PROCESSES]:
            _rewrite(rewrite, state, config, path)
    finally:
        if child == 0:
            os._exit(0)
    if child > 0:
        os.waitpid(child, 0)


def _pyc(rewrite: Any, path: Path) -> Path:
    pyc: Path = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
    return pyc


def _rewrite(rewrite: Any, state: Any, config: pytest.Config, path: Path) -> None:
    try:
        source_stat, code = rewrite._rewrite_test(path, config)
    except SyntaxError:
        return  # the worker that imports it reports it
    pyc = _pyc(rewrite, path)
    if rewrite.try_makedirs(pyc.parent):
        rewrite._write_pyc(state, code, source_stat, pyc)


def _ignore(*_: object) -> None:
    pass
