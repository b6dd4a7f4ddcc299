"""``waltz backup verify``: every file the newest manifest names against its size and SHA-256,
then every record of every partition with the ``waltz inspect verify`` engine (headers, index
against data, both checksums of each record, segments contiguous), and the txid range the
manifest claims. Files the manifest does not name (a killed run's debris) are not looked at.

Partitions are checked one at a time in a local scratch directory, so the disk needed is about
one partition's backup.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_engine.ops import inspect
from waltz_engine.ops.backup.manifest import Manifest, require_latest
from waltz_engine.ops.backup.store import BackupStore, BackupStoreError
from waltz_engine.storage.constants import CONTROL_FILE_NAME

Progress = Callable[[int, int], None]  # (files checked, files to check)


@dataclass
class BackupVerifyReport:
    url: str
    sequence: int
    files: int = 0
    bytes: int = 0
    segments: int = 0
    records: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "all checks pass" if self.ok else f"{len(self.problems)} problem(s)"
        return (
            f"backup {self.sequence} at {self.url}: checked {self.files} file(s), {self.segments} "
            f"segment(s), {self.records} record(s): {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sequence": self.sequence,
            "ok": self.ok,
            "files": self.files,
            "bytes": self.bytes,
            "segments": self.segments,
            "records": self.records,
            "problems": self.problems,
        }


def fetch_checked(
    store: BackupStore, manifest: Manifest, name: str, target: Path, problems: list[str]
) -> bool:
    """Download a named file's manifest prefix into ``target``; False (and a problem) when it is
    missing, short or does not match its checksum."""
    entry = manifest.files.get(name)
    if entry is None:
        problems.append(f"{name}: named by the manifest's partitions but not in its file list")
        return False
    try:
        digest = store.download(name, entry.size, target)
    except BackupStoreError as e:
        problems.append(f"{name}: {e}")
        return False
    if digest != entry.sha256:
        problems.append(
            f"{name}: checksum mismatch (the manifest has {entry.sha256[:12]}…, the file {digest[:12]}…)"
        )
        return False
    return True


def verify_backup(url: str, progress: Progress | None = None) -> BackupVerifyReport:
    store = BackupStore(url)
    manifest = require_latest(store)
    report = BackupVerifyReport(url, manifest.sequence)
    total = len(manifest.files)

    def checked(name: str) -> None:
        report.files += 1
        report.bytes += manifest.files[name].size if name in manifest.files else 0
        if progress is not None:
            progress(report.files, total)

    with tempfile.TemporaryDirectory(prefix="waltz-backup-verify-") as scratch_name:
        scratch = Path(scratch_name)
        control_ok = fetch_checked(
            store, manifest, manifest.control_file, scratch / CONTROL_FILE_NAME, report.problems
        )
        checked(manifest.control_file)
        if not control_ok:
            return report
        for p, entry in sorted(manifest.partitions.items()):
            directory = scratch / str(p)
            for name in entry.files():
                fetch_checked(store, manifest, name, scratch / name, report.problems)
                checked(name)
            result = inspect.verify(scratch)
            report.segments += result.segments
            report.records += result.records
            report.problems.extend(str(problem) for problem in result.problems)
            if result.records != entry.records and not result.problems:
                report.problems.append(
                    f"partition {p}: the manifest says transactions {entry.first_txid}..{entry.last_txid}, "
                    f"the segments hold {result.records} record(s)"
                )
            shutil.rmtree(directory, ignore_errors=True)
    return report
