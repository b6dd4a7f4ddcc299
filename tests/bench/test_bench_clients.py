"""`waltz bench producers|consumers` run end to end with tiny numbers (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from storage_node_support import run_waltz

# Starting ZooKeeper, three storage nodes and a server takes a few seconds, more under load.
BENCH_TIMEOUT_S = 180.0
PRODUCER_REPORT = (
    "Appended 6 transactions, with total ",
    "Transaction/sec: ",
    "MB/sec: ",
    "Retry/Transaction: ",
    "MilliSec/Transaction(client side congestion excluded): ",
    "Commit latency ms: p50 ",
    "Storage batches [storage-0]: ",
)
CONSUMER_REPORT = (
    "Read 5 transactions, with total ",
    "Transaction/sec: ",
    "MB/sec: ",
    "Data fetch latency ms: p50 ",
)
NODE_PROCESSES = ("zookeeper", "server-0", "storage-0", "storage-1", "storage-2", "client")


def _assert_report(stdout: str, prefixes: tuple[str, ...]) -> None:
    for prefix in prefixes:
        assert prefix in stdout, f"{prefix!r} missing from:\n{stdout}"
    for process in NODE_PROCESSES:
        assert f"CPU sec/1000 transactions [{process}]: " in stdout, stdout


def test_producers_prints_the_original_report_and_ours(tmp_path: Path) -> None:
    result = run_waltz(
        "bench", "producers", "--txn-size", "64", "--txns-per-thread", "3", "--threads", "2",
        "--interval-ms", "1", "--lock-pool", "4", "--dir", str(tmp_path),
        timeout_s=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _assert_report(result.stdout, PRODUCER_REPORT)


def test_consumers_prints_the_original_report_and_ours(tmp_path: Path) -> None:
    result = run_waltz(
        "bench", "consumers", "--txn-size", "64", "--txns", "5", "--num-active-partitions", "2",
        "--dir", str(tmp_path),
        timeout_s=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _assert_report(result.stdout, CONSUMER_REPORT)


def test_producers_json_against_a_given_cluster_config(tmp_path: Path) -> None:
    """--config of a running local cluster: its node processes are found from its state file."""
    from waltz_engine.ops.devcluster import LocalCluster

    with LocalCluster(tmp_path / "cluster", storages=1, partitions=1) as cluster:
        cluster.up()
        result = run_waltz(
            "bench", "producers", "--txn-size", "16", "--txns-per-thread", "2", "--threads", "1", "--json",
            "--config", str(tmp_path / "cluster" / "client.yml"),
            timeout_s=BENCH_TIMEOUT_S,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["result"]
    assert report["transactions"] == 2
    assert json.loads(result.stdout)["floor"]["commit_floor_ms"] > 0  # the same run's floor beside it
    assert set(report["cpu_s_per_1000_transactions"]) == {"zookeeper", "server-0", "storage-0", "client"}
    # Read from the storage node's /metrics: each append request was written in a disk batch.
    batches = report["storage_batches"]
    assert set(batches) == {"storage-0"}
    assert 1.0 <= batches["storage-0"]["transactions_per_append_request"] <= 2.0, batches
    assert batches["storage-0"]["append_requests_per_disk_batch"] >= 1.0, batches


def test_producers_watchers_are_fed_every_commit_in_a_process_of_their_own(tmp_path: Path) -> None:
    """--watchers: feed-only connections (the bench fails unless each was fed every commit of
    every partition) whose process's CPU is reported apart. Over 100 commits a partition, so
    each feed is suspended and asked for again (the server's minFetchSize is 100)."""
    result = run_waltz(
        "bench", "producers", "--txn-size", "16", "--txns-per-thread", "80", "--threads", "3",
        "--num-active-partitions", "2", "--watchers", "3", "--json", "--dir", str(tmp_path),
        timeout_s=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["result"]
    assert report["watchers"] == 3 and report["transactions"] == 240
    assert set(report["cpu_s_per_1000_transactions"]) == {*NODE_PROCESSES, "watchers"}


def test_producers_mount_storm_reports_every_client_mounted(tmp_path: Path) -> None:
    result = run_waltz(
        "bench", "producers", "--mount-storm", "5", "--txn-size", "16", "--txns-per-thread", "20",
        "--json", "--dir", str(tmp_path),
        timeout_s=BENCH_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["result"]
    assert report["mount_storm_clients"] == report["mounted"] == 5
    assert report["failures"] == 0 and report["first_failure"] is None
    assert report["backlog_transactions"] == 21  # 20 and the warm-up
    assert set(report["mount_latency"]) == {"p50_ms", "p99_ms", "max_ms"}
    assert report["mount_latency"]["max_ms"] >= report["mount_latency"]["p50_ms"] > 0
    assert set(report["cpu_s_during_storm"]) == set(NODE_PROCESSES)
