"""`waltz inspect verify`: every damage named once, nothing else, exit 1; clean data passes."""

from __future__ import annotations

import json
import re
import shutil
import struct
import uuid
from pathlib import Path

import pytest
from inspect_helpers import copy_storage, run, run_json, write_segment
from testkit import read_jsonl

from waltz_engine.ops.inspect import inspect_segment, verify

P0_FIRST = "0/0000000000000000000.seg"


def _kinds(report: dict[str, object]) -> set[tuple[str, str, int | None]]:
    problems = report["problems"]
    assert isinstance(problems, list)
    return {(p["file"], p["kind"], p["transaction_id"]) for p in problems}


def test_damaged_directory_names_exactly_the_four_damages(vectors: Path) -> None:
    result = run("verify", vectors / "disk" / "damaged" / "storage", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert len(report["problems"]) == 4
    assert _kinds(report) == {
        ("0/0000000000000000167.seg", "torn-record", 179),
        ("waltz-storage.ctl", "control-partition", None),
        ("2/0000000000000000000.seg", "torn-record", 25),
        (P0_FIRST, "checksum", 10),
    }
    by_kind = {(p["file"], p["transaction_id"]): p for p in report["problems"]}
    assert by_kind[("waltz-storage.ctl", None)]["partition_id"] == 1
    assert "struct 1 fails its checksum" in by_kind[("waltz-storage.ctl", None)]["message"]
    assert "data and record checksum" in by_kind[(P0_FIRST, 10)]["message"]
    assert "the index lists it" in by_kind[("0/0000000000000000167.seg", 179)]["message"]
    assert "offset 1268: 30 bytes" in by_kind[("2/0000000000000000000.seg", 25)]["message"]
    assert report["records"] == 278 and report["segments"] == 9


def test_damaged_directory_text_output(vectors: Path) -> None:
    result = run("verify", vectors / "disk" / "damaged" / "storage")
    assert result.exit_code == 1
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 4
    assert any(line.startswith("FAIL 0/0000000000000000167.seg txid 179: torn-record") for line in fails)
    assert result.stderr.count("\n") == 1 and "4 problem(s)" in result.stderr


@pytest.mark.parametrize("name", ["clean", "fresh"])
def test_clean_directories_pass(vectors: Path, name: str) -> None:
    result = run("verify", vectors / "disk" / name / "storage")
    assert result.exit_code == 0, result.output
    assert "all checks pass" in result.output
    expected = vectors / "disk" / name / "expected.jsonl"
    count = len(read_jsonl(expected)) if expected.exists() else 0
    assert run_json("verify", vectors / "disk" / name / "storage")["records"] == count


def _java_failures(text: str) -> dict[int, tuple[str, str]]:
    rows = re.findall(r"^\s+(\d+)\s+(pass|fail)\s+(pass|fail)\s*$", text, re.MULTILINE)
    return {int(txid): (index, checksum) for txid, index, checksum in rows}


@pytest.mark.parametrize("name", ["clean", "damaged"])
def test_agrees_with_java_verify_segment_where_java_did_not_repair(vectors: Path, name: str) -> None:
    base = vectors / "disk" / name
    compared = 0
    for command in read_jsonl(base / "diskcli" / "commands.jsonl"):
        words = command["command"].split()
        if words[1] != "verify-segment" or command["exit_code"] != 0 or command["files_changed_by_command"]:
            continue  # Java failed (segments not at txid 0) or its recovery rewrote the file first
        segment = base / "storage" / command["file"]
        java = (base / "diskcli" / command["stdout_file"]).read_text()
        if "-t" in words:
            txid = int(words[words.index("-t") + 1])
            (record,) = inspect_segment(segment, transaction=txid)["records"]
            ok = record["checksum_ok"] and record["record_checksum_ok"]
            mine = ("pass" if record["index_ok"] else "fail", "pass" if ok else "fail")
            java_row = re.search(r"^\s+(pass|fail)\s+(pass|fail)\s*$", java, re.MULTILINE)
            assert java_row is not None
            assert mine == java_row.groups(), command["command"]
        else:
            report = verify(segment)
            failures = {p.transaction_id: ("pass", "fail") for p in report.problems if p.kind == "checksum"}
            assert failures == _java_failures(java), command["command"]
            assert ("all check pass!" in java) == report.ok
            summary = re.search(r"(\d+) out of (\d+) check failed", java)
            if summary:
                assert (int(summary[1]), int(summary[2])) == (len(report.problems), report.records)
        compared += 1
    assert compared >= 15  # most commands of the vectors apply


def test_lone_segment_not_starting_at_zero(vectors: Path) -> None:
    # The Java tool fails here ("illegal record position:-208"); we check it like any other.
    result = run("verify", vectors / "disk" / "clean" / "storage" / "0" / "0000000000000000126.seg")
    assert result.exit_code == 0, result.output
    assert "41 record(s)" in result.output
    torn = run("verify", vectors / "disk" / "damaged" / "storage" / "0" / "0000000000000000167.idx", "--json")
    assert torn.exit_code == 1
    report = json.loads(torn.stdout)
    assert (report["ok"], report["records"], len(report["problems"])) == (False, 12, 1)
    assert report["problems"][0]["transaction_id"] == 179


def _verify_problems(storage: Path) -> list[tuple[str, str, int | None]]:
    return sorted((p.file, p.kind, p.transaction_id) for p in verify(storage).problems)


def test_index_entry_pointing_elsewhere(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    idx = storage / "3" / "0000000000000000000.idx"
    content = bytearray(idx.read_bytes())
    struct.pack_into(">q", content, 128 + 8 * 2, 128)  # txid 2 -> the offset of txid 0
    idx.write_bytes(bytes(content))
    assert _verify_problems(storage) == [("3/0000000000000000000.seg", "index-mismatch", 2)]
    (problem,) = verify(storage).problems
    assert "offset 128 (a record with txid 0)" in problem.message


def test_records_beyond_the_index_are_reported(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    idx = storage / "3" / "0000000000000000000.idx"
    idx.write_bytes(idx.read_bytes()[:-16])  # the index forgets txids 2 and 3
    assert _verify_problems(storage) == [
        ("3/0000000000000000000.seg", "unindexed-record", 2),
        ("3/0000000000000000000.seg", "unindexed-record", 3),
    ]


def test_index_listing_more_than_the_data(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    idx = storage / "3" / "0000000000000000000.idx"
    idx.write_bytes(idx.read_bytes() + struct.pack(">qq", 308, 353))
    assert _verify_problems(storage) == [("3/0000000000000000000.seg", "index-beyond-data", 4)]


def test_headers_checked_against_names_partition_and_key(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    shutil.rmtree(storage / "3")
    write_segment(storage / "3", 0, [b"p3-t0"], partition=2)
    other_key = storage / "2"
    shutil.rmtree(other_key)
    write_segment(other_key, 0, [b"x"] * 20, partition=2, key=uuid.UUID(int=1))
    problems = verify(storage).problems
    messages = [(p.file, p.kind, p.message) for p in problems]
    assert ("3/0000000000000000000.seg", "header", "header says partition 2, the directory 3") in messages
    assert any(f == "2/0000000000000000000.seg" and "cluster key" in m for f, _, m in messages)
    # Partition 2's local low-water mark is 19 but only 0..19 survive: fine; partition 3's is -1: fine.
    assert {p.kind for p in problems} == {"header"}


def test_gap_between_segments_and_lost_committed_data(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    for suffix in (".seg", ".idx"):
        (storage / "0" / f"0000000000000000126{suffix}").unlink()
        (storage / "1" / f"0000000000000000042{suffix}").unlink()
    (storage / "1" / "0000000000000000000.idx").unlink()
    problems = _verify_problems(storage)
    assert ("0/0000000000000000167.seg", "segment-gap", None) in problems
    assert ("1", "low-water-mark", None) in problems  # local low-water mark 59, data ends at 41
    assert ("1/0000000000000000000.seg", "index-missing", None) in problems
    assert len(problems) == 3


def test_misnamed_segment_and_orphan_index(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    for suffix in (".seg", ".idx"):
        (storage / "3" / f"0000000000000000000{suffix}").rename(
            storage / "3" / f"0000000000000000005{suffix}"
        )
    (storage / "2" / "0000000000000000000.seg").unlink()
    problems = _verify_problems(storage)
    assert ("3/0000000000000000005.seg", "header", None) in problems
    assert ("2/0000000000000000000.idx", "orphan-index", None) in problems
    assert ("2", "low-water-mark", None) in problems


def test_garbage_segment_in_directory_is_a_problem_not_a_crash(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "fresh", tmp_path)
    (storage / "1" / "0000000000000000007.seg").write_bytes(b"not a segment at all")
    result = run("verify", storage)
    assert result.exit_code == 1
    assert (
        "FAIL 1/0000000000000000007.seg" in result.stdout
        and "shorter than the 128-byte header" in result.stdout
    )


def test_control_file_alone(vectors: Path) -> None:
    damaged = verify(vectors / "disk" / "damaged" / "storage" / "waltz-storage.ctl")
    assert [(p.kind, p.partition_id) for p in damaged.problems] == [("control-partition", 1)]
    assert (damaged.control_files, damaged.segments) == (1, 0)
    both = verify(vectors / "disk" / "damaged-control-both" / "storage" / "waltz-storage.ctl")
    assert [(p.partition_id, "partition info corrupted" in p.message) for p in both.problems] == [(3, True)]


def test_partition_directory_gone_with_committed_data(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    shutil.rmtree(storage / "2")
    assert _verify_problems(storage) == [("2", "low-water-mark", None)]
    assert "local low-water mark 19 but the directory is missing" in str(verify(storage).problems[0])
