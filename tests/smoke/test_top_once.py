"""`waltz top` against a real cluster: what `--once --json` shows follows what was written; into
a pipe it prints JSON lines (--json) or plain snapshots, never live redraws; bad input is one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from cluster_support import local_cluster, run_waltz_cli, waltz_cli_command

from waltz_engine.ops.devcluster import LocalCluster

NUM_PARTITIONS = 2
NUM_APPENDS = 3
TOP_TIMEOUT_S = 60.0
FAST_INTERVAL_MS = "200"
SNAPSHOTS = 3
# What rich's live view sends to redraw in place: cursor up / erase line / hide cursor.
REDRAW_CODES = ("\x1b[1A", "\x1b[2K", "\x1b[?25l")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=NUM_PARTITIONS) as c:
        yield c


def _top_json(cluster: LocalCluster) -> dict[str, object]:
    result = run_waltz_cli(
        "top", "--config", str(cluster.client_config_path), "--once", "--json", timeout_s=TOP_TIMEOUT_S
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
    assert servers[0]["healthy"] is True and servers[0]["partitions"] == list(range(NUM_PARTITIONS))
    partitions = {p["partition"]: p for p in after["partitions"]}  # type: ignore[attr-defined]
    hwm_before = {p["partition"]: p["high_water_mark"] for p in before["partitions"]}  # type: ignore[attr-defined]
    assert partitions[0]["high_water_mark"] == hwm_before[0] + NUM_APPENDS
    assert partitions[1]["high_water_mark"] == hwm_before[1]
    assert partitions[0]["generation"] >= 0 and partitions[0]["store_session_id"] >= 0
    assert {r["storage"] for r in partitions[0]["replicas"]} == {n.connect_string for n in cluster.storages}
    storages = after["storages"]
    assert isinstance(storages, list) and len(storages) == len(cluster.storages)
    # Storage nodes are named as the cluster knows them (their data address), in port order.
    names = sorted((n.connect_string for n in cluster.storages), key=lambda a: int(a.rpartition(":")[2]))
    assert [node["storage"] for node in storages] == names
    text = run_waltz_cli("top", "--config", str(cluster.client_config_path), "--once")
    assert text.returncode == 0 and all(name in text.stdout for name in names), text.stderr
    # Every replica acknowledged the appends (no fault here), so none lags.
    lags = [r["lag"] for node in storages for r in node["replicas"] if r["partition"] == 0]
    assert lags and all(lag is not None and lag >= 0 for lag in lags)


def _top_into_head(cluster: LocalCluster, lines: int, *args: str) -> tuple[str, subprocess.Popen[str]]:
    """`waltz top ARGS | head -n LINES`: head's output, and top, ended (it must end by itself)."""
    top = subprocess.Popen(
        waltz_cli_command("top", "-c", str(cluster.client_config_path), "-i", FAST_INTERVAL_MS, *args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert top.stdout is not None
    head = subprocess.Popen(["head", "-n", str(lines)], stdin=top.stdout, stdout=subprocess.PIPE, text=True)
    top.stdout.close()
    try:
        out, _ = head.communicate(timeout=TOP_TIMEOUT_S)
        top.wait(TOP_TIMEOUT_S)  # the next snapshot meets the closed pipe
    finally:
        if top.poll() is None:
            top.kill()
    return out, top


def test_top_json_without_once_prints_json_lines_into_a_pipe(cluster: LocalCluster) -> None:
    out, top = _top_into_head(cluster, SNAPSHOTS, "--json")
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == SNAPSHOTS
    assert all(len(d["partitions"]) == NUM_PARTITIONS and d["servers"] for d in documents)
    taken = [d["taken_at_ms"] for d in documents]
    assert taken == sorted(taken) and len(set(taken)) == SNAPSHOTS
    assert top.returncode == 0
    assert top.stderr is not None and top.stderr.read() == ""


def test_top_into_a_pipe_prints_plain_snapshots(cluster: LocalCluster) -> None:
    once = run_waltz_cli("top", "-c", str(cluster.client_config_path), "--once")
    assert once.returncode == 0, once.stderr
    lines_per_snapshot = len(once.stdout.splitlines())
    out, top = _top_into_head(cluster, 2 * lines_per_snapshot)
    titles = [line for line in out.splitlines() if line.startswith("waltz top — ")]
    assert len(titles) == 2, out
    assert "q quits" not in out and not any(code in out for code in REDRAW_CODES)
    assert all(len(line) < 200 for line in out.splitlines())  # tables at their own width
    assert top.returncode == 0
    assert top.stderr is not None and top.stderr.read() == ""


def test_top_bad_interval_is_one_line(cluster: LocalCluster) -> None:
    for flag in ("--interval-ms", "--interval", "-i"):
        result = run_waltz_cli("top", "-c", str(cluster.client_config_path), flag, "abc")
        assert result.returncode == 2, result
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
        assert "'--interval-ms'" in result.stderr and "Traceback" not in result.stderr
    too_fast = run_waltz_cli("top", "-c", str(cluster.client_config_path), "-i", "10")
    assert too_fast.returncode == 2 and too_fast.stderr.count("\n") == 1, too_fast.stderr
