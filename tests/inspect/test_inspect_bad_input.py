"""Input that is not a storage file: one line naming the file and the problem, exit 1, no traceback."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from inspect_helpers import run

from waltz_engine.disk.control_reader import CONTROL_FILE_NAME

RANDOM_BYTES = 4096
RANDOM_SEED = 20240613  # fixed: the same foreign file every run


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (path, what the error must say), each under the names every command expects."""
    cases: dict[str, tuple[Path, str]] = {}
    for label, content, complaint in (
        ("empty", b"", "0 bytes, shorter than the 128-byte header"),
        ("truncated", b"\0" * 100, "100 bytes, shorter than the 128-byte header"),
        ("random", random.Random(RANDOM_SEED).randbytes(RANDOM_BYTES), "unsupported"),
        ("text", b"hello, this is a text file and not a segment\n" * 10, "unsupported"),
    ):
        for kind, name in (("seg", "0000000000000000000.seg"), ("ctl", CONTROL_FILE_NAME)):
            directory = tmp_path / f"{label}-{kind}"
            directory.mkdir()
            path = directory / name
            path.write_bytes(content)
            cases[f"{label}-{kind}"] = (path, complaint)
    return cases


def _assert_one_line_error(args: tuple[str | Path, ...], *needles: str) -> None:
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.output.count("\n") == 1, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def test_bad_segment_files(tmp_path: Path) -> None:
    for name, (path, complaint) in _bad_files(tmp_path).items():
        if name.endswith("-seg"):
            for command in ("segment", "verify", "stats"):
                _assert_one_line_error((command, path), str(path), "not a segment file", complaint)


def test_bad_control_files(tmp_path: Path) -> None:
    for name, (path, complaint) in _bad_files(tmp_path).items():
        if name.endswith("-ctl"):
            for args in (
                ("control", path),
                ("control", path.parent),
                ("verify", path),
                ("verify", path.parent),
            ):
                _assert_one_line_error(args, str(path), "not a control file", complaint)


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "0000000000000000000.seg"
    for command in ("control", "segment", "verify", "stats"):
        _assert_one_line_error((command, missing), str(missing), "no such file or directory")


def test_directory_without_control_file(tmp_path: Path) -> None:
    for command in ("control", "verify"):
        _assert_one_line_error((command, tmp_path), str(tmp_path), f"no {CONTROL_FILE_NAME}")
    _assert_one_line_error(("stats", tmp_path), str(tmp_path), "no .seg files")
    _assert_one_line_error(("segment", tmp_path), str(tmp_path), "is a directory")


def test_wrong_kind_of_file(tmp_path: Path, vectors: Path) -> None:
    storage = vectors / "disk" / "clean" / "storage"
    _assert_one_line_error(("segment", storage / CONTROL_FILE_NAME), "this is the control file")
    segment = storage / "0" / "0000000000000000000.seg"
    _assert_one_line_error(("control", segment), "this is a segment file")
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    for command in ("segment", "verify", "stats"):
        _assert_one_line_error((command, notes), str(notes), "expected a .seg file")


@pytest.mark.parametrize("command", ["control", "segment", "verify", "stats"])
def test_help_has_an_example(command: str) -> None:
    result = run(command, "--help")
    assert result.exit_code == 0
    assert f"waltz inspect {command}" in result.output and "Example" in result.output
