"""``waltz backup restore``: a backup (its newest manifest) into a new storage directory that a
storage node, ours or the original's, starts on.

Every file is checked against the manifest on the way. The control file is written anew with
the storage engine's writer: the restored partitions are assigned and available, their
low-water mark and local low-water mark are the last restored transaction (every record in a
backup was committed), and their session id is -1, older than any session the cluster issued.
So the server's next store session does not let the restored replica vote: it keeps what the
replica holds up to its low-water mark and catches it up from the other replicas (see
``waltz_engine.server.store.recovery``). With ``to_txid`` the log is cut after that
transaction (a point in time).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_engine.ops.backup.manifest import NO_TRANSACTION, BackupError, require_latest
from waltz_engine.ops.backup.store import BackupStore
from waltz_engine.ops.backup.verify import fetch_checked
from waltz_engine.storage.storage_manager import StorageManager

Progress = Callable[[int, int], None]  # (files restored, files to restore)
# The session id of a restored partition: older than every store session the cluster issues.
RESTORED_SESSION_ID = -1


@dataclass
class RestoreSummary:
    url: str
    directory: str
    sequence: int
    files: int = 0
    bytes: int = 0
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "directory": self.directory,
            "sequence": self.sequence,
            "files": self.files,
            "bytes": self.bytes,
            "partitions": {str(p): v for p, v in sorted(self.partitions.items())},
        }


def restore_backup(
    url: str,
    directory: Path,
    *,
    to_txid: int | None = None,
    partitions: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> RestoreSummary:
    store = BackupStore(url)
    manifest = require_latest(store)
    wanted = sorted(manifest.partitions) if partitions is None else sorted(set(partitions))
    missing = [p for p in wanted if p not in manifest.partitions]
    if missing:
        raise BackupError(
            f"partition(s) {', '.join(map(str, missing))} are not in the backup at {url} "
            f"(it holds {', '.join(map(str, sorted(manifest.partitions))) or 'none'}); choose among those"
        )
    if to_txid is not None and to_txid < NO_TRANSACTION:
        raise BackupError(f"--to-txid must be -1 or more, got {to_txid}")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise BackupError(f"{directory} is not empty; restore into a new or empty directory")
    for p in wanted:
        entry = manifest.partitions[p]
        if to_txid is not None and entry.records and to_txid < entry.first_txid - 1:
            raise BackupError(
                f"partition {p}: the backup starts at transaction {entry.first_txid}, "
                f"--to-txid {to_txid} is before it"
            )
    summary = RestoreSummary(url, str(directory), manifest.sequence)
    names = [name for p in wanted for name in manifest.partitions[p].files()]
    problems: list[str] = []
    directory.mkdir(parents=True, exist_ok=True)
    # The files go to a scratch directory beside the target, and move in once all are checked.
    with tempfile.TemporaryDirectory(prefix=".restoring-", dir=directory) as scratch_name:
        scratch = Path(scratch_name)
        for name in names:
            if fetch_checked(store, manifest, name, scratch / name, problems):
                summary.bytes += manifest.files[name].size
            summary.files += 1
            if progress is not None:
                progress(summary.files, len(names))
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise BackupError(
                f"the backup is damaged, nothing restored: {problems[0]}{more}; "
                "run 'waltz backup verify' for the whole list"
            )
        for p in wanted:
            (scratch / str(p)).rename(directory / str(p))
    with StorageManager(directory, manifest.cluster_key, manifest.num_partitions) as manager:
        manager.set_partition_assignment(wanted, True)
        for p in wanted:
            partition = manager.partition(p)
            last = partition.max_transaction_id()
            if to_txid is not None and to_txid < last:
                last = partition.truncate(to_txid)
            partition.set_low_water_mark(RESTORED_SESSION_ID, last)
            summary.partitions[p] = {"first_txid": partition.first_transaction_id(), "last_txid": last}
        manager.set_partition_available(wanted, True)
    return summary
