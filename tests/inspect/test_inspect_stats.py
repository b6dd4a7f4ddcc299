"""`waltz inspect stats`: the Java segment-statistic numbers, for every segment."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_helpers import run, run_json, write_segment
from testkit import read_jsonl

from waltz_engine.ops.inspect import segment_stats

JAVA_COLUMNS = 5  # rows, max, min, average, median


def _java_row(text: str) -> list[str]:
    rows = [line.split() for line in text.splitlines()]
    (row,) = [r for r in rows if len(r) == JAVA_COLUMNS and r[0].isdigit()]
    return row


@pytest.mark.parametrize("name", ["clean", "fresh", "damaged"])
def test_matches_java_segment_statistic(vectors: Path, name: str) -> None:
    base = vectors / "disk" / name
    compared = 0
    for command in read_jsonl(base / "diskcli" / "commands.jsonl"):
        if "segment-statistic" not in command["command"] or command["exit_code"] != 0:
            continue  # Java cannot do segments that do not start at txid 0
        count, maximum, minimum, mean, median = _java_row(
            (base / "diskcli" / command["stdout_file"]).read_text()
        )
        (ours,) = run_json("stats", base / "storage" / command["file"])
        assert ours["record_count"] == int(count)
        if int(count) == 0:
            # Java prints Integer.MIN_VALUE / MAX_VALUE and 0.0 here; an empty segment has no sizes.
            assert [ours[k] for k in ("min_data_bytes", "max_data_bytes", "mean_data_bytes")] == [None] * 3
            assert ours["median_data_bytes"] is None
        else:
            assert (ours["max_data_bytes"], ours["min_data_bytes"]) == (int(maximum), int(minimum))
            assert ours["mean_data_bytes"] == pytest.approx(float(mean))
            assert ours["median_data_bytes"] == float(median)
        compared += 1
    assert compared == 4


def test_directory_gives_one_row_per_segment_including_later_ones(vectors: Path) -> None:
    storage = vectors / "disk" / "clean" / "storage"
    rows = run_json("stats", storage)
    expected = read_jsonl(vectors / "disk" / "clean" / "expected.jsonl")
    assert [r["file"] for r in rows] == [str(p.relative_to(storage)) for p in sorted(storage.glob("*/*.seg"))]
    assert sum(r["record_count"] for r in rows) == len(expected)
    late = next(r for r in rows if r["file"] == "0/0000000000000000126.seg")
    sizes = [len(bytes.fromhex(e["data_hex"])) for e in expected if e["segment"] == "0000000000000000126.seg"]
    assert (late["record_count"], late["min_data_bytes"], late["max_data_bytes"]) == (
        41,
        min(sizes),
        max(sizes),
    )
    assert late["total_data_bytes"] == sum(sizes)


def test_median_of_an_even_count_and_partition_directory(tmp_path: Path) -> None:
    write_segment(tmp_path / "0", 0, [b"a", b"bbb", b"cc", b"dddddd"])
    write_segment(tmp_path / "0", 4, [b"x" * 10])
    first, second = segment_stats(tmp_path / "0")
    assert (first.record_count, first.median_data_bytes, first.mean_data_bytes) == (4, 2.5, 3.0)
    assert (second.first_transaction_id, second.median_data_bytes) == (4, 10.0)


def test_table_shows_dash_for_empty_segments(vectors: Path) -> None:
    result = run("stats", vectors / "disk" / "fresh" / "storage" / "3" / "0000000000000000000.seg")
    assert result.exit_code == 0
    row = next(line for line in result.stdout.splitlines() if "│ 3 " in line)
    assert row.count(" - ") == 4 and "2147483647" not in result.stdout


def test_damaged_segment_counts_whole_records_and_warns(vectors: Path) -> None:
    result = run("stats", vectors / "disk" / "damaged" / "storage" / "2")
    assert result.exit_code == 0
    assert "warning: problems in 0000000000000000000.seg" in result.stdout
    (row,) = segment_stats(vectors / "disk" / "damaged" / "storage" / "2")
    assert (row.record_count, row.problem_count) == (25, 1)
