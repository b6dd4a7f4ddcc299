"""`waltz spark export`'s options (pure Python, no Spark session): -c/-z/-r with their
environment variables, -p ids and ranges (and the hidden old --partitions), -o, -m."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import spark.export
from spark.plan import OPTION_CLUSTER_ROOT, OPTION_PARTITIONS, OPTION_PATHS, OPTION_ZOOKEEPER
from waltz_cli.main import app
from waltz_engine.common.errors import WaltzError

STOP = "stopped before Spark"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """The export's config as the command made it; the command stops before Spark starts."""
    seen: dict[str, Any] = {}

    def check_config(config: spark.export.ExportConfig) -> None:
        seen["config"] = config
        raise WaltzError(STOP)

    monkeypatch.setattr(spark.export, "check_config", check_config)
    for name in ("WALTZ_CONFIG", "WALTZ_ZOOKEEPER", "WALTZ_CLUSTER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return seen


def _export(*args: str) -> None:
    result = CliRunner().invoke(app, ["spark", "export", *args])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: {STOP}"


def test_short_flags(asked: dict[str, Any], tmp_path: Path) -> None:
    _export("-o", "out", "-p", "0,2-3", "-z", "127.0.0.1:2181", "-r", "/waltz", "-m", "local[1]", "storage")
    config = asked["config"]
    assert config.output == (tmp_path / "out").resolve()
    assert config.read_options == {
        OPTION_PATHS: str((tmp_path / "storage").resolve()),
        "on_corrupt": "fail",
        OPTION_ZOOKEEPER: "127.0.0.1:2181",
        OPTION_CLUSTER_ROOT: "/waltz",
        OPTION_PARTITIONS: "0,2-3",
    }


def test_the_old_partitions_flag_still_works_but_not_beside_the_new(asked: dict[str, Any]) -> None:
    _export("--output", "out", "--partitions", "1-2", "storage")
    assert asked["config"].read_options[OPTION_PARTITIONS] == "1-2"
    both = CliRunner().invoke(
        app, ["spark", "export", "-o", "out", "-p", "1", "--partitions", "2", "storage"]
    )
    assert both.exit_code == 1
    assert both.stderr.strip() == "error: give --partition (or its old spelling --partitions), not both"


def test_the_cluster_from_the_environment_and_no_dev_cluster_fallback(
    asked: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dev = tmp_path / ".waltz-dev"
    dev.mkdir()
    (dev / "client.yml").write_text("zookeeper.connectString: 127.0.0.1:1\ncluster.root: /dev\n")
    _export("-o", "out", "storage")  # a dev cluster here is not used: ZooKeeper is optional
    assert OPTION_ZOOKEEPER not in asked["config"].read_options

    config = tmp_path / "client.yml"
    config.write_text("zookeeper.connectString: 127.0.0.1:2181\ncluster.root: /from-file\n")
    monkeypatch.setenv("WALTZ_CONFIG", str(config))
    monkeypatch.setenv("WALTZ_CLUSTER_ROOT", "/from-env")
    _export("-o", "out", "storage")
    options = asked["config"].read_options
    assert (options[OPTION_ZOOKEEPER], options[OPTION_CLUSTER_ROOT]) == ("127.0.0.1:2181", "/from-env")


def test_on_corrupt_reaches_the_read_options(asked: dict[str, Any]) -> None:
    _export("-o", "out", "--on-corrupt", "skip", "storage")
    assert asked["config"].read_options["on_corrupt"] == "skip"
