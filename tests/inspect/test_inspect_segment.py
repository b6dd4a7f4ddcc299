"""`waltz inspect segment`: the records and headers the Java storage node's own classes read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inspect_helpers import run, run_json, write_segment
from testkit import read_jsonl

from waltz_cli.output import human_size
from waltz_engine.ops.inspect import inspect_segment

RECORD_FIELDS = (
    "transaction_id",
    "offset",
    "header",
    "data_hex",
    "checksum",
    "checksum_ok",
    "record_checksum_ok",
)
REQ_ID_FIELDS = {
    "client_id": "clientId",
    "generation": "generation",
    "partition_id": "partitionId",
    "seq_num": "seqNum",
}


def _expected_record(row: dict[str, Any]) -> dict[str, Any]:
    mapped = {name: row["transactionId" if name == "transaction_id" else name] for name in RECORD_FIELDS}
    mapped.update({ours: row["reqId"][theirs] for ours, theirs in REQ_ID_FIELDS.items()})
    return mapped


def _expected_header(header: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": header["version"],
        "creation_time": header["creationTime"],
        "key": header["key"],
        "partition_id": header["partitionId"],
        "first_transaction_id": header["firstTransactionId"],
    }


@pytest.mark.parametrize("name", ["clean", "fresh"])
def test_every_segment_matches_the_java_read_back(vectors: Path, name: str) -> None:
    base = vectors / "disk" / name
    control = json.loads((base / "control.json").read_text())
    expected_file = base / "expected.jsonl"
    expected = read_jsonl(expected_file) if expected_file.exists() else []
    assert control["segments"], "the vectors list segments"
    seen = 0
    for segment in control["segments"]:
        path = base / "storage" / str(segment["partition"]) / segment["segment"]
        result = run_json("segment", path)
        assert result["header"] == _expected_header(segment["dataHeader"])
        assert result["index_header"] == _expected_header(segment["indexHeader"])
        wanted = [
            _expected_record(r)
            for r in expected
            if r["partition"] == segment["partition"] and r["segment"] == segment["segment"]
        ]
        got = [{k: r[k] for k in (*RECORD_FIELDS, *REQ_ID_FIELDS)} for r in result["records"]]
        assert got == wanted
        assert len(got) == segment["numRecords"]
        assert result["problems"] == []
        assert all(r["index_ok"] for r in result["records"])
        seen += len(got)
    assert seen == len(expected)


def test_record_extras_match_the_java_read_back(vectors: Path) -> None:
    base = vectors / "disk" / "clean"
    expected = [r for r in read_jsonl(base / "expected.jsonl") if r["partition"] == 3]
    got = run_json("segment", base / "storage" / "3" / "0000000000000000000.seg")["records"]
    assert [r["record_checksum"] for r in got] == [r["record_checksum"] for r in expected]
    assert [r["data_text"] for r in got] == [r["data_utf8"] for r in expected]
    assert [r["data_size"] + 40 for r in got] == [r["record_size"] for r in expected]


def test_transaction_and_limit_select_records(vectors: Path) -> None:
    path = vectors / "disk" / "clean" / "storage" / "0" / "0000000000000000084.seg"
    one = run_json("segment", path, "--transaction", "100")["records"]
    assert [r["transaction_id"] for r in one] == [100]
    assert one[0]["data_hex"] == b"p0-t100".hex()
    first = run_json("segment", path, "--max", "3")["records"]
    assert [r["transaction_id"] for r in first] == [84, 85, 86]
    # --transaction with --max: that many from the transaction on (the README's example).
    three = run_json("segment", path, "--transaction", "100", "--max", "3")["records"]
    assert [r["transaction_id"] for r in three] == [100, 101, 102]
    # --limit, the name before --max, is a hidden alias.
    assert run_json("segment", path, "--limit", "3")["records"] == first


def test_transaction_not_in_segment_is_one_line_error(vectors: Path) -> None:
    path = vectors / "disk" / "clean" / "storage" / "0" / "0000000000000000084.seg"
    result = run("segment", path, "--transaction", "7")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "no record for txid 7" in result.output


def test_damaged_segments_show_damage(vectors: Path) -> None:
    storage = vectors / "disk" / "damaged" / "storage"
    rotten = run_json("segment", storage / "0" / "0000000000000000000.seg", "-t", "10")
    (record,) = rotten["records"]
    assert record["data_text"] == "q0-t10"
    assert (record["checksum_ok"], record["record_checksum_ok"]) == (False, False)
    # The Java dump-segment shows the damaged data with the original data checksum.
    assert record["checksum"] == -85617515
    assert [p["kind"] for p in rotten["problems"]] == ["checksum"]

    torn = run_json("segment", storage / "0" / "0000000000000000167.seg")
    assert [r["transaction_id"] for r in torn["records"]] == list(range(167, 179))
    (problem,) = torn["problems"]
    assert (problem["kind"], problem["transaction_id"], problem["offset"]) == ("torn-record", 179, 692)


def test_table_output_names_records_and_problems(vectors: Path) -> None:
    result = run("segment", vectors / "disk" / "damaged" / "storage" / "2" / "0000000000000000000.seg")
    assert result.exit_code == 0
    assert "p2-t24" in result.output
    assert "torn-record: txid 25" in result.output
    # The size for people, the exact bytes in --json.
    path = vectors / "disk" / "damaged" / "storage" / "2" / "0000000000000000000.seg"
    size_bytes = run_json("segment", path)["data_size_bytes"]
    assert f"Data {human_size(size_bytes)}, index " in result.output


def test_sizes_for_people_are_rounded_with_binary_units() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 137_801, 5 * 1024**3)] == [
        "0 B", "1023 B", "1.0 KiB", "134.6 KiB", "5.0 GiB",
    ]  # fmt: skip


def test_decoder_output_is_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inspect_test_codec.py").write_text(
        "def upper(data):\n    return data.decode().upper()\n\n"
        "def picky(data):\n"
        "    if data.endswith(b'1'):\n"
        "        raise ValueError('no ones')\n"
        "    return {'n': len(data)}\n"
    )
    monkeypatch.chdir(tmp_path)
    seg = write_segment(tmp_path / "0", 0, [b"a0", b"a1"])
    upper = run_json("segment", seg, "--decoder", "inspect_test_codec:upper")["records"]
    assert [r["decoded"] for r in upper] == ["A0", "A1"]
    picky = run_json("segment", seg, "--decoder", "inspect_test_codec:picky")["records"]
    assert picky[0]["decoded"] == {"n": 2}
    assert picky[1]["decode_error"] == "ValueError: no ones"
    table = run("segment", seg, "--decoder", "inspect_test_codec:upper")
    assert table.exit_code == 0 and "A1" in table.output


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("nocolon", "expected module:function"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("json:no_such_function", "has no attribute"),
        ("json.decoder:JSONArray.__doc__", "not a function"),
    ],
)
def test_bad_decoder_is_one_line_error(vectors: Path, spec: str, complaint: str) -> None:
    path = vectors / "disk" / "clean" / "storage" / "3" / "0000000000000000000.seg"
    result = run("segment", path, "--decoder", spec)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and complaint in result.output
    assert "Traceback" not in result.output


def test_library_reads_a_segment_not_starting_at_zero(tmp_path: Path) -> None:
    seg = write_segment(tmp_path / "4", 1000, [b"x" * n for n in range(5)], partition=4)
    result = inspect_segment(seg, transaction=1003)
    assert [r["transaction_id"] for r in result["records"]] == [1003]
    assert result["records"][0]["data_size"] == 3
    assert inspect_segment(seg)["header"]["first_transaction_id"] == 1000


def test_markup_like_data_is_shown_verbatim(tmp_path: Path) -> None:
    seg = write_segment(tmp_path / "0", 0, [b"[/red] [bold]x", b"\x00\xff\x1b[31m"])
    result = run("segment", seg)
    assert result.exit_code == 0, result.output
    assert "[/red]" in result.output and "[bold]x" in result.output  # (the cell may wrap between them)
    assert "...[31m" in result.output  # control bytes become dots, never reach the terminal
