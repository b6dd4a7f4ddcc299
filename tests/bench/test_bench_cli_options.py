"""`waltz bench` options without running a benchmark: renamed flags, their hidden old names,
and where a running cluster is found (pure Python, no cluster)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.bench import producers
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.common.errors import WaltzError

STOP = "stopped before the benchmark"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `bench producers|consumers` would run on: the cluster arguments, then a stop."""
    seen: dict[str, Any] = {}

    @contextlib.contextmanager
    def bench_cluster(
        running: Any, directory: Path, storages: int, partitions: int, progress: Any
    ) -> Iterator[Any]:
        seen.update(running=running, partitions=partitions, directory=directory)
        raise WaltzError(STOP)
        yield  # pragma: no cover

    monkeypatch.setattr(producers, "bench_cluster", bench_cluster)
    for name in ("WALTZ_CONFIG", "WALTZ_ZOOKEEPER", "WALTZ_CLUSTER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return seen


def _stopped(*args: str) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: {STOP}"


@pytest.mark.parametrize("command", ["producers", "consumers"])
@pytest.mark.parametrize("flag", ["--num-active-partitions", "-ap", "--partitions"])
def test_active_partitions_under_every_name(asked: dict[str, Any], command: str, flag: str) -> None:
    _stopped(command, flag, "3", "-d", "/tmp/nowhere")
    assert asked["partitions"] == 3
    assert asked["directory"] == Path("/tmp/nowhere")
    assert not asked["running"].given  # no -c/-z/-r: a cluster of our own


def test_the_old_short_flags_are_gone_and_long_ones_kept(asked: dict[str, Any]) -> None:
    _stopped("producers", "--txn-size", "8", "--txns-per-thread", "2", "--threads", "2", "--clients", "2",
             "--max-in-flight", "1", "-i", "0", "-l", "4", "-ml", "--mount-from-latest")  # fmt: skip
    _stopped("consumers", "--txn-size", "8", "--txns", "2")
    for old in (["-s", "8"], ["-p", "2"], ["-t", "2"]):
        result = CliRunner().invoke(app, ["bench", "producers", *old])
        assert result.exit_code == 2 and "No such option" in result.output, result.output


def test_a_running_cluster_from_flags_or_the_environment(
    asked: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _stopped("consumers", "-z", "127.0.0.1:2181", "-r", "/waltz")
    assert asked["running"] == producers.RunningCluster(None, "127.0.0.1:2181", "/waltz")
    monkeypatch.setenv("WALTZ_CONFIG", "/etc/waltz/client.yml")
    _stopped("producers")
    assert asked["running"] == producers.RunningCluster(Path("/etc/waltz/client.yml"), None, None)


def test_a_running_cluster_needs_both_zookeeper_and_root(tmp_path: Path) -> None:
    config = tmp_path / "client.yml"
    config.write_text("zookeeper.connectString: 127.0.0.1:2181\ncluster.root: /from-file\n")
    cluster = producers.load_cluster(config, cluster_root="/given")
    assert cluster.client_config["cluster.root"] == "/given"
    assert cluster.client_config["zookeeper.connectString"] == "127.0.0.1:2181"
    with pytest.raises(BenchError, match="no 'cluster.root': pass --cluster-root"):
        producers.load_cluster(None, zookeeper="127.0.0.1:2181")


def test_engine_duration_is_in_seconds_with_the_old_name_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    from waltz_engine.bench import engine_bench

    seen: dict[str, Any] = {}

    def run(directory: Path, **kwargs: Any) -> list[Any]:
        seen.update(kwargs)
        return []

    monkeypatch.setattr(engine_bench, "run", run)
    for flag in ("--duration-s", "--seconds"):
        result = CliRunner().invoke(app, ["bench", "engine", "-d", "/tmp", flag, "0.5", "--json"])
        assert result.exit_code == 0, result.output
        assert seen["seconds"] == 0.5
    both = CliRunner().invoke(app, ["bench", "engine", "--duration-s", "1", "--records", "5"])
    assert both.exit_code == 1 and both.stderr.strip() == "error: give --duration-s or --records, not both"
