"""`waltz inspect control`: what control.json and the Java dump-control-file say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inspect_helpers import run, run_json

from waltz_engine.ops.inspect import inspect_control

JAVA_DUMP = "waltz-storage.ctl.dump-control-file.txt"
JAVA_COLUMNS = 6  # partition, session, lwm, local lwm, assigned, available


def _java_rows(dump: Path) -> list[tuple[str, ...]]:
    rows = [tuple(line.split()) for line in dump.read_text().splitlines()]
    return [row for row in rows if len(row) == JAVA_COLUMNS and row[0].isdigit()]


@pytest.mark.parametrize("name", ["clean", "fresh", "damaged"])
def test_control_matches_java(vectors: Path, name: str) -> None:
    base = vectors / "disk" / name
    control = json.loads(
        (base / ("control-after-recovery.json" if name == "damaged" else "control.json")).read_text()
    )
    ours = run_json("control", base / "storage")
    assert ours["key"] == control["header"]["key"]
    assert ours["num_partitions"] == control["header"]["numPartitions"]
    assert ours["creation_time"] == control["header"]["creationTime"]
    assert ours["version"] == control["header"]["version"]
    for p, theirs in zip(ours["partitions"], control["partitions"], strict=True):
        current = theirs["current"]
        assert p["partition_id"] == theirs["partitionId"]
        assert (p["session_id"], p["low_water_mark"], p["local_low_water_mark"]) == (
            current["sessionId"],
            current["lowWaterMark"],
            current["localLowWaterMark"],
        )
        assert (p["flags"], p["sequence_number"]) == (current["flags"], current["sequenceNumber"])
        assert (p["assigned"], p["available"]) == (current["isAssigned"], current["isAvailable"])
        assert (p["struct1_valid"], p["struct2_valid"]) == (
            theirs["struct1"]["valid"],
            theirs["struct2"]["valid"],
        )
        assert p["struct1"]["checksum"] == theirs["struct1"]["checksum"]
    java = _java_rows(base / "diskcli" / JAVA_DUMP)
    mine = [
        tuple(str(v).lower() for v in (p["partition_id"], p["session_id"], p["low_water_mark"]))
        + tuple(str(v).lower() for v in (p["local_low_water_mark"], p["assigned"], p["available"]))
        for p in ours["partitions"]
    ]
    assert mine == java
    assert f"Control File Key: {ours['key']}" in (base / "diskcli" / JAVA_DUMP).read_text()


def test_damaged_partition_falls_back_to_struct_2(vectors: Path) -> None:
    result = run("control", vectors / "disk" / "damaged" / "storage" / "waltz-storage.ctl", "--json")
    assert result.exit_code == 0  # the node starts fine on it: the other struct is sound
    p1 = json.loads(result.stdout)["partitions"][1]
    assert (p1["session_id"], p1["low_water_mark"], p1["local_low_water_mark"]) == (0, -1, -1)
    assert (p1["current_struct"], p1["struct1_valid"], p1["struct2_valid"]) == (2, False, True)
    assert "struct 1 fails its checksum" in p1["problems"][0]
    table = run("control", vectors / "disk" / "damaged" / "storage")
    assert table.exit_code == 0
    assert "(other" in table.output  # the current struct's column flags the damaged one
    assert "warning: partition 1: struct 1 fails its checksum" in table.output


def test_both_structs_corrupted_shows_the_others_and_fails(vectors: Path) -> None:
    storage = vectors / "disk" / "damaged-control-both" / "storage"
    for args in (("control", storage), ("control", storage, "--json")):
        result = run(*args)
        assert result.exit_code == 1
        assert result.stderr.count("\n") == 1
        assert "partition 3: partition info corrupted" in result.stderr
        assert "Traceback" not in result.output
    shown = json.loads(run("control", storage, "--json").stdout)["partitions"]
    assert [p["corrupted"] for p in shown] == [False, False, False, True]
    assert shown[3]["session_id"] is None and shown[3]["current_struct"] is None
    assert [p["local_low_water_mark"] for p in shown[:3]] == [149, 59, 19]


def test_partition_filter(vectors: Path) -> None:
    storage = vectors / "disk" / "clean" / "storage"
    result = run_json("control", storage, "--partition", "2")
    assert [p["partition_id"] for p in result["partitions"]] == [2]
    assert result["partitions"][0]["low_water_mark"] == 19
    missing = run("control", storage, "-p", "9")
    assert missing.exit_code == 1 and "no partition 9 (it has 4)" in missing.output


def test_table_shows_key_and_marks(vectors: Path) -> None:
    result = run("control", vectors / "disk" / "clean" / "storage")
    assert result.exit_code == 0
    assert "dad1ea14-6351-4aca-a2fd-ba73d70294b2" in result.output
    assert "149" in result.output and "59" in result.output


def test_truncated_control_file_keeps_whole_partitions(tmp_path: Path, vectors: Path) -> None:
    content = (vectors / "disk" / "clean" / "storage" / "waltz-storage.ctl").read_bytes()
    path = tmp_path / "waltz-storage.ctl"
    path.write_bytes(content[:-10])
    result = inspect_control(path)
    assert [p["partition_id"] for p in result["partitions"]] == [0, 1, 2]
    assert "partitions 3..3 missing" in result["problems"][0]
    assert run("control", path).exit_code == 1
