"""`waltz bench export` end to end with a tiny log (no timing asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from storage_node_support import run_waltz

# Generating a tiny log is quick; the export starts a Spark JVM, slower under load.
BENCH_TIMEOUT_S = 240.0
ROWS = 2_000
PARTITIONS = 2


def test_export_bench_reports_the_parser_and_the_export_of_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    common = ["bench", "export", "--dir", str(tmp_path), "--rows", str(ROWS), "--partitions", str(PARTITIONS)]
    result = run_waltz(*common, "--json", timeout_s=BENCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["result"]
    assert report["parse_rows"] == report["export_rows"] == ROWS
    assert report["parse_rows_per_s"] > 0 and report["export_rows_per_s"] > 0
    # A second run reuses the log it generated (generate_s 0) and prints a table.
    again = run_waltz(*common, "--skip-export", timeout_s=BENCH_TIMEOUT_S)
    assert again.returncode == 0, again.stderr
    assert "parse_rows_per_s" in again.stdout and "export_rows" not in again.stdout
    assert "generate_s" in again.stdout
