"""Committing an export run into its output directory: all of a run's files and its new
watermarks, or none of them, whatever moment the process dies.

Protocol (all under ``<output>/_waltz_export/``, on the output's file system):

1. The Spark tasks write the run's files into ``staging/`` (hive-style ``partition=N/``), each
   fsynced (:mod:`spark.export_task`).
2. The staging directories are fsynced, then ``commit.json`` — the list of staged files and
   the new watermarks — is written atomically. This is the commit point: before it, the run
   never happened; after it, it must finish.
3. Each staged file is renamed into ``<output>/partition=N/`` (a file already moved is skipped).
4. ``watermarks.json`` is replaced atomically; then ``commit.json`` and ``staging/`` go.

:func:`recover` runs at the start of every export: with a ``commit.json`` it redoes 3–4
(idempotent), without one it deletes ``staging/`` (a run killed before its commit point).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from spark.watermarks import (
    load_file_watermarks,
    save_file_watermarks,
    state_dir,
    write_json_atomically,
)
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.fileio import fsync_directory
from waltz_engine.zk.export_watermarks import Watermarks

STAGING_DIR_NAME = "staging"
COMMIT_FILE_NAME = "commit.json"


class CommitError(WaltzError):
    """A run's files are not where its commit says they are."""


@dataclass(frozen=True)
class PendingCommit:
    files: tuple[str, ...]  # relative to the staging (and output) directory
    watermarks: Watermarks


def staging_dir(output: Path) -> Path:
    return state_dir(output) / STAGING_DIR_NAME


def _commit_file(output: Path) -> Path:
    return state_dir(output) / COMMIT_FILE_NAME


def prepare(output: Path, files: Iterable[str], watermarks: Mapping[int, int]) -> PendingCommit:
    """Step 2: make the staged run (``files``, relative to the staging directory) durable as a
    whole (the commit point)."""
    pending = PendingCommit(tuple(sorted(files)), dict(watermarks))
    staging = staging_dir(output)
    missing = [name for name in pending.files if not (staging / name).is_file()]
    if missing:
        raise CommitError(f"{output}: staged files missing before the commit ({', '.join(missing[:3])})")
    for directory in {(staging / name).parent for name in pending.files}:
        fsync_directory(directory)
    write_json_atomically(
        _commit_file(output),
        {"files": list(pending.files), "watermarks": {str(p): t for p, t in pending.watermarks.items()}},
    )
    return pending


def _load_pending(output: Path) -> PendingCommit | None:
    path = _commit_file(output)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return PendingCommit(tuple(raw["files"]), {int(p): int(t) for p, t in raw["watermarks"].items()})


def finish(output: Path, pending: PendingCommit) -> None:
    """Steps 3–4; safe to repeat after a crash at any point of a previous attempt."""
    staging = staging_dir(output)
    touched: set[Path] = set()
    for name in pending.files:
        source, target = staging / name, output / name
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)
            touched.add(target.parent)
        elif not target.exists():
            raise CommitError(
                f"{output}: the committed run lists {name}, which is neither staged nor exported; "
                f"the export is damaged: re-export into a new directory"
            )
    for directory in touched:
        fsync_directory(directory)
    merged = load_file_watermarks(output)
    merged.update(pending.watermarks)
    save_file_watermarks(output, merged)
    _commit_file(output).unlink()
    shutil.rmtree(staging, ignore_errors=True)


def recover(output: Path) -> bool:
    """Finish or discard what a killed run left; True when a committed run was completed."""
    pending = _load_pending(output)
    if pending is not None:
        finish(output, pending)
        return True
    shutil.rmtree(staging_dir(output), ignore_errors=True)
    return False
