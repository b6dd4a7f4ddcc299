"""`waltz inspect frame` over real frames from the Java original."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner
from wire_vector_support import line_id, snake, wire_lines

from waltz_cli.main import app

runner = CliRunner()

# One representative frame per codec, with the JSON the command must print for it.
EXPECTED = [
    (
        "4c0004000000110b00000001000000020000000300000004",
        {
            "magic": "L",
            "version": 4,
            "type": 11,
            "name": "HIGH_WATER_MARK_REQUEST",
            "fields": {"req_id": {"client_id": 1, "generation": 2, "partition_id": 3, "seq_num": 4}},
        },
    ),
    (
        "4c0004000000510e00000009000000000000000000000000000000030000000f6c6f63616c686f73743a3535333030010000000f"
        "6c6f63616c686f73743a3535323930000000000f6c6f63616c686f73743a353532383001",
        {
            "magic": "L",
            "version": 4,
            "type": 14,
            "name": "CHECK_STORAGE_CONNECTIVITY_RESPONSE",
            "fields": {
                "req_id": {"client_id": 9, "generation": 0, "partition_id": 0, "seq_num": 0},
                "storage_connectivity_map": [
                    ["localhost:55300", True],
                    ["localhost:55290", False],
                    ["localhost:55280", True],
                ],
            },
        },
    ),
    (
        "4100000000001d03ffffffffffffffff858e4b2f0fc9426486b7e8e617bd214100000004",
        {
            "magic": "A",
            "version": 0,
            "type": 3,
            "name": "OPEN_REQUEST",
            "fields": {"seq_num": -1, "key": "858e4b2f-0fc9-4264-86b7-e8e617bd2141", "num_partitions": 4},
        },
    ),
    (
        "4800000000001e00000005000000010002000300040000000c57616c747a20536572766572",
        {
            "magic": "H",
            "version": 0,
            "type": -1,
            "name": "HELLO",
            "fields": {"versions": [0, 1, 2, 3, 4], "message": "Waltz Server"},
        },
    ),
    ("53000000000000", {"magic": "S", "version": 0, "type": -2, "name": "KEEP_ALIVE", "fields": {}}),
]


@pytest.mark.parametrize(("hex_frame", "expected"), EXPECTED, ids=[e[1]["name"] for e in EXPECTED])
def test_json_output(hex_frame: str, expected: dict[str, Any]) -> None:
    result = runner.invoke(app, ["inspect", "frame", hex_frame, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == expected


def test_separators_are_tolerated() -> None:
    spaced = " ".join(EXPECTED[0][0][i : i + 2] for i in range(0, len(EXPECTED[0][0]), 2))
    result = runner.invoke(app, ["inspect", "frame", spaced.replace(" 00 ", ":00:"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == EXPECTED[0][1]


def test_json_fields_match_vectors() -> None:
    line = next(x for x in wire_lines("storage_S") if x["variant"] == "two-records")
    result = runner.invoke(app, ["inspect", "frame", line["frame_hex"], "--json"])
    fields = json.loads(result.stdout)["fields"]
    assert sorted(fields) == sorted(snake(k) for k in line["fields"])
    assert fields["records"][1]["data"] == line["fields"]["records"][1]["data"]
    assert fields["records"][1]["req_id"]["seq_num"] == 7


def test_human_output_names_every_field() -> None:
    line = next(x for x in wire_lines("storage_S") if x["name"] == "FAILURE_RESPONSE")
    result = runner.invoke(app, ["inspect", "frame", line["frame_hex"]])
    assert result.exit_code == 0, result.output
    for word in (
        "FAILURE_RESPONSE",
        "session_id",
        "stack_trace",
        "class_name",
        "StorageManager.java",
        "null",
    ):
        assert word in result.stdout


def test_stdin_mode_over_a_whole_vector_file() -> None:
    lines = [x for x in wire_lines("client_server_L") if x["frame_hex"]]
    stdin = "".join(x["frame_hex"] + "\n" for x in lines)
    result = runner.invoke(app, ["inspect", "frame", "-"], input=stdin)
    outputs = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(outputs) == len(lines)
    for line, output in zip(lines, outputs, strict=True):
        if line["decode"] == "error":
            assert "error" in output, line_id(line)
        else:
            assert (output["name"], output["type"], output["version"]) == (
                line["name"],
                line["type"],
                line["version"],
            )
    # Some vectors are deliberately bad (checksum errors), so the run as a whole fails.
    assert result.exit_code == 1


def test_stdin_mode_all_good_exits_zero() -> None:
    result = runner.invoke(app, ["inspect", "frame", "-"], input="4c000000000000\n\n41000000000000\n")
    assert result.exit_code == 0
    assert [json.loads(x)["name"] for x in result.stdout.splitlines()] == ["KEEP_ALIVE", "KEEP_ALIVE"]


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("4c00zz", "unexpected character 'z'"),
        ("4c0004000000110b000000010000000200000003", "frame header says 17 payload bytes but only 13 follow"),
        ("5a000400000000", "unknown frame magic 0x5a ('Z')"),
        ("4c0009000000110b00000001000000020000000300000004", "unsupported version 9"),
        ("4c0004000000110b00000001000000020000000300000004000", "odd number of hex digits (51)"),
        (
            "4c0004000000110b0000000100000002000000030000000400",
            "1 trailing byte after the 17-byte frame payload",
        ),
        (
            "4c0004000000120b0000000100000002000000030000000400",
            "HIGH_WATER_MARK_REQUEST: 1 byte trailing after",
        ),
        ("", "no hex digits given"),
        ("4c000400000011ff00000001000000020000000300000004", "unknown message type -1 in codec L v4"),
    ],
)
def test_bad_frames_give_one_line_errors(argument: str, message: str) -> None:
    result = runner.invoke(app, ["inspect", "frame", argument, "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert "Traceback" not in result.output
