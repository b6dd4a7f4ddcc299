"""Fixtures shared by every test: the golden vectors and one real ZooKeeper per session (per
pytest-xdist worker under `-n`, each with temporary directories of its own).

Plain helpers are in testkit.py; they are re-exported here only for older imports.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import typer.testing
from suite_bytecode import compile_suite
from testkit import free_tcp_port, read_jsonl, slice_port_range_for_worker, unique_cluster_root, vectors_dir

__all__ = ["free_tcp_port", "read_jsonl", "unique_cluster_root", "vectors_dir"]


@pytest.fixture(scope="session")
def vectors() -> Path:
    return vectors_dir()


# Every JVM a test starts is short-lived: the client compiler alone and the serial collector cut a
# local Spark session's CPU by ~45% (26 s to 14 s, measured), and the suite is CPU-bound on 2
# cores. `default` options go before the product's own (`waltz spark export` sets the driver's
# log configuration); the standalone cluster's master and worker read SPARK_DAEMON_JAVA_OPTS.
TEST_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    f'--conf "spark.driver.defaultJavaOptions={TEST_JVM_FLAGS}" '
    f'--conf "spark.executor.defaultJavaOptions={TEST_JVM_FLAGS}" pyspark-shell',
)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JVM_FLAGS)


slice_port_range_for_worker(os.environ)


# typer builds the whole click command tree again on every `CliRunner().invoke(app, ...)`: 0.17 s
# of CPU for the `waltz` app (measured; 80% of an in-process `waltz inspect segment`), and the
# suite invokes commands in-process several hundred times. A tree once built does not change
# until a command or group is added to the app, which the count kept beside it notices.
_built_commands: dict[typer.Typer, tuple[tuple[int, int], Any]] = {}


def _built_command(app: typer.Typer) -> Any:
    size = (len(app.registered_commands), len(app.registered_groups))
    built = _built_commands.get(app)
    if built is None or built[0] != size:
        built = _built_commands[app] = (size, typer.main.get_command(app))
    return built[1]


typer.testing._get_command = _built_command  # type: ignore[attr-defined, assignment]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        compile_suite(config)
    # A run stopped with SIGTERM (a CI timeout, `timeout`, `kill`) unwinds like Ctrl-C, so the
    # session's fixtures stop what they started (ZooKeeper, nodes) instead of leaving it running.
    # Under `-n`, signal the process group, as Ctrl-C, `timeout` and `kill -- -PGID` do: a
    # controller signalled alone ends its xdist workers within seconds, too soon under load for
    # them to stop their clusters, which are then left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # A suite started in the background by a non-interactive shell (`cmd &`) inherits SIGINT
    # ignored and hands that on to every process it starts: a test pressing Ctrl-C on a child
    # (examples/consumer.py) then waits for an exit that never comes.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The fixtures of tests on real processes: every cluster takes the session's ZooKeeper, and
# `session` is the Spark tests' SparkSession.
PROCESS_FIXTURES = frozenset({"zookeeper", "session"})


# The costliest files, in seconds of wall time under the README's command on 2 cores (per-file
# sums, 2026-11-26, nodes forked from the zygote). Longest first is the classic bound for greedy
# scheduling: a long file handed out last leaves one worker busy while the others idle.
MEASURED_FILE_COST_S = {
    "spark/test_spark_export_cluster.py": 260,
    "client_real/test_client_real_waltz_client.py": 175,
    "spark/test_spark_export_progress.py": 140,
    "spark/test_spark_datasource.py": 110,
    "devcluster/test_devcluster_cli.py": 90,
    "install/test_base_install.py": 85,
    "smoke/test_smoke_run.py": 75,
    "wire/test_wire_fuzz.py": 75,
    "client_cli/test_client_cli_commands.py": 65,
    "backup/test_backup_cluster.py": 65,
    "nodes/test_decommission_resumed.py": 45,
    "nodes/test_nodes_come_and_go.py": 45,
    "nodes/test_moves_after_retention.py": 45,
    "bench/test_bench_clients.py": 45,
    "backup/test_backup_disaster.py": 40,
    "tier/test_tier_cluster.py": 40,
    "net/test_connection_limits.py": 30,
    "inspect/test_inspect_readonly.py": 30,
    "wire/test_wire_properties.py": 28,
}


def _measured_cost_s(path: Path) -> int:
    return MEASURED_FILE_COST_S.get(f"{path.parent.name}/{path.name}", 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under `-n`, pytest-xdist hands whole files to workers in this order (with
    # --no-loadscope-reorder), so the longest go first: the measured costliest files, then files
    # with `slow` tests, then by their count of tests on real processes, then unit files by size.
    # The run then ends on short work spread over the workers, not one worker alone on a long file.
    if not hasattr(config, "workerinput"):  # not an xdist worker: the order is the files'
        return
    tests = Counter(item.path for item in items)
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    on_processes = Counter(
        item.path for item in items if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    )
    items.sort(
        key=lambda item: (
            -_measured_cost_s(item.path),
            -slow[item.path],
            -on_processes[item.path],
            -tests[item.path],
        )
    )


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
