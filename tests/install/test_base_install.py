"""The base install (`pip install <repo>`, no extras) in a fresh venv: no pyspark, pandas or
pyarrow; a dev cluster (ZooKeeper from the system's jars), the CLI and the README's client
examples work from it; a feature of an extra says in one line how to install it.

One venv per module (the costly part: about 20 s of CPU, mostly pip); every test uses it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit import REPO_ROOT

from waltz_engine.zk.server import DEV_DATA_DIR, PID_FILE_NAME, SYSTEM_JAVA_DIR, system_classpath

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(system_classpath() is None, reason="needs libzookeeper-java (.ci/run installs it)"),
]

PIP_TIMEOUT_S = 600
COMMAND_TIMEOUT_S = 180
# The README's Python blocks that need an extra (the Spark data source) are not run here.
README_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
NEEDS_AN_EXTRA = ("spark",)


class BaseVenv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "venv" / "bin"
        self.work = root / "work"  # where the dev cluster and the examples run
        # Only what a fresh shell has: no PYTHONPATH (it would reach past the venv) nor WALTZ_*.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("WALTZ_")}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', '')}"

    def run(self, *command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=self.work,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "python"), "-c", code)

    def waltz(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "waltz"), *args, stdin=stdin)


def _copy_sources(target: Path) -> None:
    """The checkout's files (tracked or new, not ignored): pip builds in the source tree, and
    must neither write there nor pick up what is ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
        timeout=COMMAND_TIMEOUT_S,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseVenv]:
    base = BaseVenv(tmp_path_factory.mktemp("base-install"))
    source = base.root / "source"
    _copy_sources(source)
    base.work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base.root / "venv")], check=True)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(base.bin / "python"), "install", "-q", str(source)],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        env=base.env,
    )
    assert installed.returncode == 0, installed.stderr
    yield base


@pytest.fixture(scope="module")
def dev_cluster(venv: BaseVenv) -> Iterator[BaseVenv]:
    try:
        up = venv.waltz("dev", "up", "--detach")
        assert up.returncode == 0, up.stderr
        yield venv
    finally:
        venv.waltz("dev", "down", "--clean")


def test_the_base_install_has_no_spark_pandas_or_pyarrow(venv: BaseVenv) -> None:
    for module in ("pyspark", "pandas", "pyarrow"):
        result = venv.python(f"import {module}")
        assert result.returncode == 1 and f"No module named '{module}'" in result.stderr
    assert venv.python("import numpy, waltz_engine.client, waltz_engine.storage").returncode == 0


def test_a_dev_cluster_from_the_base_install_takes_appends_and_tails(dev_cluster: BaseVenv) -> None:
    appended = dev_cluster.waltz("append", "--partition", "0", "-", stdin="hello, waltz\n")
    assert appended.returncode == 0, appended.stderr
    tailed = dev_cluster.waltz("tail", "--partition", "0", "--no-follow", "--data")
    assert tailed.returncode == 0 and "hello, waltz" in tailed.stdout, tailed.stderr
    zookeeper_pid = (dev_cluster.work / DEV_DATA_DIR / PID_FILE_NAME).read_text().strip()
    command_line = Path(f"/proc/{zookeeper_pid}/cmdline").read_bytes()
    assert str(SYSTEM_JAVA_DIR / "zookeeper.jar").encode() in command_line  # not pyspark's jars


def test_the_readmes_client_examples_run_from_the_base_install(dev_cluster: BaseVenv) -> None:
    blocks = README_BLOCK.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    runnable = [b for b in blocks if not any(word in b for word in NEEDS_AN_EXTRA)]
    assert any("waltz_engine.client" in block for block in runnable)
    for block in runnable:
        result = dev_cluster.python(block)
        assert result.returncode == 0, f"{block}\n{result.stderr}"


def test_features_of_an_extra_say_how_to_install_it(venv: BaseVenv) -> None:
    export = venv.waltz("spark", "export", "--output", "out", "--zookeeper", "127.0.0.1:1")
    backup = venv.waltz("backup", "list", "backups")
    for result, extra in ((export, "spark"), (backup, "backup")):
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert f"pip install 'waltz-py[{extra}]'" in result.stderr
    data_source = venv.python("import spark.datasource")
    assert data_source.returncode == 1
    last_line = data_source.stderr.strip().splitlines()[-1]
    assert last_line.startswith("waltz_engine.common.extras.MissingExtraError: the Waltz Spark data source")
    assert last_line.endswith("pip install 'waltz-py[spark]' (in a clone: pip install -e '.[spark]')")
