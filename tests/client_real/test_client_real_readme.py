"""README's client examples, run exactly as written against a real cluster.

Each ```python block under a ``<!-- README example ... -->`` marker runs as its own process in a
project directory holding the cluster's ``.waltz-dev/client.yml`` (as ``waltz dev up`` leaves
it), the synchronous one from a subdirectory: the client finds the dev cluster above it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_support import module_cluster, run_waltz_cli

from waltz_engine.common.config import dev_client_config_path
from waltz_engine.ops.devcluster import LocalCluster

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE = re.compile(r"<!-- README example[^>]*-->\n```python\n(.*?)```", re.S)
MAX_EXAMPLE_LINES = 14
EXAMPLE_TIMEOUT_S = 120.0

cluster = module_cluster(storages=1, partitions=2)


def readme_examples() -> list[str]:
    return EXAMPLE.findall(README.read_text(encoding="utf-8"))


@pytest.fixture
def project(cluster: LocalCluster, tmp_path: Path) -> Path:
    """A directory as `waltz dev up` leaves one: ``.waltz-dev/client.yml`` of the cluster."""
    config = tmp_path / dev_client_config_path()
    config.parent.mkdir()
    shutil.copy(cluster.client_config_path, config)
    return tmp_path


def run_example(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        check=False,
    )


def test_readme_has_a_sync_and_an_asyncio_example_each_under_15_lines() -> None:
    examples = readme_examples()
    assert len(examples) == 2
    assert "SyncWaltzClient(" in examples[0] and "asyncio.run(" in examples[1]
    assert all(len(code.splitlines()) <= MAX_EXAMPLE_LINES for code in examples)


@pytest.mark.parametrize(("index", "data"), [(0, b"hello, waltz"), (1, b"hello, asyncio")])
def test_readme_example_appends_and_reads_back(project: Path, index: int, data: bytes) -> None:
    where = project / "src" / "app" if index == 0 else project
    where.mkdir(parents=True, exist_ok=True)
    done = run_example(readme_examples()[index], where)
    assert done.returncode == 0, done.stderr
    # Its own transaction, applied: "<partition> <txid> b'...'" on partition 0.
    lines = [line.split(" ", 2) for line in done.stdout.splitlines()]
    assert ["0", repr(data)] in [[p, d] for p, _txid, d in lines], done.stdout


def test_commands_find_the_dev_cluster_from_a_directory_below_it(project: Path) -> None:
    """The CLI's search is the client's: ``waltz append``/``tail`` from ``examples/`` find the
    cluster whose ``.waltz-dev/`` is one directory up (they used to suggest starting another)."""
    below = project / "examples"
    below.mkdir()
    appended = run_waltz_cli("append", "-p", "1", "-", cwd=below, stdin="from below\n")
    assert appended.returncode == 0, appended.stderr
    tailed = run_waltz_cli("tail", "-p", "1", "--no-follow", "--data", cwd=below)
    assert tailed.returncode == 0, tailed.stderr
    assert "from below" in tailed.stdout
