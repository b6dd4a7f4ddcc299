"""Every `waltz inspect` storage command leaves every byte alone, and needs no lock."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_helpers import copy_storage, run, segments_of

from waltz_engine.disk.control_reader import CONTROL_FILE_NAME
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES

# Holds the storage node's lock (fcntl, bytes 0..127 of the control file, as Java's FileLock
# does on Linux) in another process until its stdin closes.
_LOCK_HOLDER = f"""
import fcntl, sys
f = open(sys.argv[1], "r+b")
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, {HEADER_SIZE_BYTES}, 0)
print("locked", flush=True)
sys.stdin.read()
"""


def _digests(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _every_command(storage: Path) -> list[int]:
    codes = [run("control", storage).exit_code, run("verify", storage).exit_code]
    for segment in segments_of(storage):
        codes += [
            run("segment", segment).exit_code,
            run("segment", segment, "--json").exit_code,
            run("verify", segment).exit_code,
            run("stats", segment).exit_code,
        ]
    if segments_of(storage):
        codes.append(run("stats", storage).exit_code)
    return codes


@pytest.mark.parametrize("name", ["clean", "fresh", "damaged", "damaged-control-both"])
def test_files_unchanged_after_all_commands(tmp_path: Path, vectors: Path, name: str) -> None:
    storage = copy_storage(vectors, name, tmp_path)
    before = _digests(storage)
    codes = _every_command(storage)
    assert _digests(storage) == before
    # The commands really ran (damage makes some exit 1, but never with a crash).
    assert set(codes) <= {0, 1} and (name != "clean" or set(codes) == {0})


def test_works_while_a_node_holds_the_lock(tmp_path: Path, vectors: Path) -> None:
    storage = copy_storage(vectors, "clean", tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(storage / CONTROL_FILE_NAME)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        # Proof that the lock is held: taking it from here fails.
        with (storage / CONTROL_FILE_NAME).open("r+b") as f, pytest.raises(OSError):
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, HEADER_SIZE_BYTES, 0)
        assert set(_every_command(storage)) == {0}
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
