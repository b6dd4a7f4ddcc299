"""Shared helpers of the Spark tests: one session per module, the CLI as a subprocess, and a
Spark standalone master + worker (from the pyspark wheel) as real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pyarrow.dataset as ds
import pyspark
from pyspark.sql import SparkSession
from testkit import free_tcp_port

from spark.datasource import register
from spark.export import DAEMON_MODULE_CONF
from spark.worker_daemon import DAEMON_MODULE

# `waltz spark ...` registered as waltz_cli/main.py will, so the tests do not depend on it.
WALTZ_SPARK_MAIN = """
import sys, typer
from waltz_cli.commands import spark
app = typer.Typer(pretty_exceptions_enable=False)
app.add_typer(spark.app, name="spark")
sys.argv[0] = "waltz"
app()
"""
CLI_TIMEOUT_S = 240.0
LOCALHOST = "127.0.0.1"
LOCAL_MASTER = "local[2]"

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
WORKER_CORES = 2
WORKER_MEMORY = "2g"
# Bounds the wait for the master to list the worker as alive (never asserted on as a duration).
STANDALONE_UP_DEADLINE_S = 90.0
STANDALONE_POLL_S = 0.25
# After SIGTERM, how long a JVM gets to exit before SIGKILL.
STOP_GRACE_S = 10.0


def configure_spark_environment() -> None:
    os.environ["SPARK_LOCAL_IP"] = LOCALHOST
    os.environ["PYSPARK_PYTHON"] = sys.executable


@contextmanager
def local_spark_session() -> Iterator[SparkSession]:
    """The module's one in-process session (``local[2]``, no UI), ``waltz`` source registered."""
    configure_spark_environment()
    session = (
        SparkSession.builder.master(LOCAL_MASTER)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config(DAEMON_MODULE_CONF, DAEMON_MODULE)
        .getOrCreate()
    )
    register(session)
    try:
        yield session
    finally:
        session.stop()


def spark_cli_command(*args: str) -> list[str]:
    return [sys.executable, "-c", WALTZ_SPARK_MAIN, "spark", *args]


def run_spark_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    configure_spark_environment()
    return subprocess.run(
        spark_cli_command(*args), capture_output=True, text=True, cwd=cwd, timeout=CLI_TIMEOUT_S, check=False
    )


def exported_rows(output: Path) -> list[dict[str, object]]:
    """Every exported row (hive partition column restored), ordered by (partition, txid)."""
    table = ds.dataset(output, format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["transaction_id"]))


# --- a Spark standalone cluster -----------------------------------------------------------------


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the JVM's process group (spark-class execs java), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _alive_workers(web_ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{web_ui_port}/json/", timeout=2) as response:
            state = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return 0  # not listening yet
    alive: int = state.get("aliveworkers", 0)
    return alive


@contextmanager
def standalone_cluster(directory: Path) -> Iterator[str]:
    """A standalone master and one worker on 127.0.0.1; yields ``spark://127.0.0.1:PORT`` once
    the worker has registered. Both are always stopped; their logs are in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    port, web_ui_port, worker_web_ui_port = free_tcp_port(), free_tcp_port(), free_tcp_port()
    url = f"spark://{LOCALHOST}:{port}"
    environment = {
        **os.environ,
        "SPARK_LOCAL_IP": LOCALHOST,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
    }
    daemons = [
        (
            "master",
            [MASTER_CLASS, "--host", LOCALHOST, "--port", str(port), "--webui-port", str(web_ui_port)],
        ),
        (
            "worker",
            [
                WORKER_CLASS,
                url,
                "--host",
                LOCALHOST,
                "--webui-port",
                str(worker_web_ui_port),
                "--cores",
                str(WORKER_CORES),
                "--memory",
                WORKER_MEMORY,
                # Not $SPARK_HOME/work: that is inside the installed wheel.
                "--work-dir",
                str(directory / "work"),
            ],
        ),
    ]
    with ExitStack() as stack:
        for name, arguments in daemons:
            log = stack.enter_context((directory / f"{name}.log").open("wb"))
            process = subprocess.Popen(
                [str(SPARK_CLASS), *arguments],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
            stack.callback(_stop_process_group, process)
        deadline = time.monotonic() + STANDALONE_UP_DEADLINE_S
        while _alive_workers(web_ui_port) < 1:
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text(errors="replace")[-2000:] for p in directory.glob("*.log")}
                raise AssertionError(f"the standalone worker never registered with {url}: {logs}")
            time.sleep(STANDALONE_POLL_S)
        yield url


def writable_clean_storage(vectors: Path, tmp_path: Path) -> Path:
    """A writable copy of the golden clean storage directory (the vectors are read-only)."""
    copy = tmp_path / "storage"
    shutil.copytree(vectors / "disk" / "clean" / "storage", copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy
