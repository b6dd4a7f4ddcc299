"""`waltz bench floor` (issue 23 item 1): the commit floor measured on a real disk and loopback."""

from __future__ import annotations

import json
from pathlib import Path

from cluster_support import run_waltz_cli

SAMPLES = "20"


def test_floor_prints_each_figure_and_the_commit_floor_from_them(tmp_path: Path) -> None:
    done = run_waltz_cli("bench", "floor", "--dir", str(tmp_path), "--samples", SAMPLES, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for key in ("fsync_p50_ms", "quorum_fsync_p50_ms", "tls_round_trip_p50_ms", "commit_floor_ms"):
        assert result[key] > 0, key
    expected = 2 * result["tls_round_trip_p50_ms"] + result["quorum_fsync_p50_ms"]
    assert abs(result["commit_floor_ms"] - expected) < 0.002
    # The CPU floor of one request (issue 33): a blocking-thread TLS echo plus a write + fdatasync.
    assert result["echo_cpu_us"] > 0 and result["write_sync_cpu_us"] > 0
    cpu_floor_us = result["echo_cpu_us"] + result["write_sync_cpu_us"]
    assert abs(result["request_cpu_floor_ms"] * 1000 - cpu_floor_us) < 0.5
    assert result["samples"] == int(SAMPLES) and "load_average" in result["machine"]
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone


def test_floor_on_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    done = run_waltz_cli("bench", "floor", "--dir", str(tmp_path / "missing"))
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "is not a directory" in done.stderr
