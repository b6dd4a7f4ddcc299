"""`waltz top --once --json` against a real cluster: what it shows follows what was written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cluster_support import local_cluster, run_waltz_cli

from waltz_engine.devcluster import LocalCluster

NUM_PARTITIONS = 2
NUM_APPENDS = 3
TOP_TIMEOUT_S = 60.0
TOP_MAIN = """
import sys, typer
from waltz_cli.commands.top import top
app = typer.Typer(pretty_exceptions_enable=False)
app.command()(top)
sys.argv[0] = "waltz top"
app()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=NUM_PARTITIONS) as c:
        yield c


def _top_json(cluster: LocalCluster) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", TOP_MAIN, "--config", str(cluster.client_config_path), "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=TOP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    snapshot: dict[str, object] = json.loads(result.stdout)
    return snapshot


def test_top_once_json_shows_servers_partitions_and_replicas(cluster: LocalCluster) -> None:
    before = _top_json(cluster)
    lines = "\n".join(f"txn-{i}" for i in range(NUM_APPENDS)) + "\n"
    appended = run_waltz_cli(
        "append", "--config", str(cluster.client_config_path), "-p", "0", "-", stdin=lines
    )
    assert appended.returncode == 0, appended.stderr
    after = _top_json(cluster)

    servers = after["servers"]
    assert isinstance(servers, list) and len(servers) == 1
    assert servers[0]["healthy"] is True and sorted(servers[0]["partitions"]) == list(range(NUM_PARTITIONS))
    partitions = {p["partition"]: p for p in after["partitions"]}  # type: ignore[attr-defined]
    hwm_before = {p["partition"]: p["high_water_mark"] for p in before["partitions"]}  # type: ignore[attr-defined]
    assert partitions[0]["high_water_mark"] == hwm_before[0] + NUM_APPENDS
    assert partitions[1]["high_water_mark"] == hwm_before[1]
    assert partitions[0]["generation"] >= 0 and partitions[0]["store_session_id"] >= 0
    assert {r["storage"] for r in partitions[0]["replicas"]} == {n.connect_string for n in cluster.storages}
    storages = after["storages"]
    assert isinstance(storages, list) and len(storages) == len(cluster.storages)
    # Every replica acknowledged the appends (no fault here), so none lags.
    lags = [r["lag"] for node in storages for r in node["replicas"] if r["partition"] == 0]
    assert lags and all(lag is not None and lag >= 0 for lag in lags)
