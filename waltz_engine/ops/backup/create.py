"""``waltz backup create``: the committed log of a live cluster, read over the network (the
original's RECORD_LIST_REQUEST, so Java nodes too), into a backup that is itself a storage
directory in the original's format.

A run builds, in a local staging directory and with the storage engine's own writers, each
partition's newest backed-up segment (its manifest prefix, downloaded) extended with what was
committed since; files that are new or grew are uploaded, then the manifest, then the pointer
(:mod:`.manifest`). A sealed segment is therefore uploaded once, when complete; only the newest
segment of a partition is uploaded again while it grows. A run that stops anywhere before the
pointer moves leaves the previous backup as it was.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_engine.common.object_store import FileEntry
from waltz_engine.disk.partition_info import FLAG_ASSIGNED
from waltz_engine.ops.backup.manifest import (
    MANIFEST_DIR,
    NO_TRANSACTION,
    POINTER_NAME,
    BackupError,
    Manifest,
    PartitionEntry,
    publish,
    read_latest,
)
from waltz_engine.ops.backup.store import TMP_DIR, BackupStore, sha256_of_file
from waltz_engine.storage.constants import CONTROL_FILE_NAME, INDEX_SUFFIX, SEGMENT_SUFFIX, segment_paths
from waltz_engine.storage.control_file import ControlFile
from waltz_engine.storage.network_reader import ClusterAccess, ClusterLayout, discover, read_slice_records
from waltz_engine.storage.partition import Partition

# A backup's segments roll over past this size: small enough that the newest segment, which a
# run downloads and uploads again while it grows, stays cheap to move.
DEFAULT_SEGMENT_SIZE_BYTES = 64 * 1024 * 1024

Progress = Callable[[int, int], None]  # (records copied, records to copy)


@dataclass
class CreateSummary:
    url: str
    sequence: int
    published: bool  # False: nothing new was committed, the backup is unchanged
    records_added: int = 0
    files_uploaded: int = 0
    bytes_uploaded: int = 0
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sequence": self.sequence,
            "published": self.published,
            "records_added": self.records_added,
            "files_uploaded": self.files_uploaded,
            "bytes_uploaded": self.bytes_uploaded,
            "seconds": round(self.seconds, 3),
            "partitions": {str(p): v for p, v in sorted(self.partitions.items())},
        }


def _check_location(store: BackupStore) -> None:
    """A first run goes only to an empty place, or one holding a killed first run's debris."""
    known = {CONTROL_FILE_NAME, POINTER_NAME, MANIFEST_DIR, TMP_DIR}
    strangers = [n for n in store.list_names(files_only=False) if n not in known and not n.isdigit()]
    if strangers:
        raise BackupError(
            f"{store.url} holds files that are not a backup's ({', '.join(strangers[:3])}); "
            "give an empty or new location"
        )


def _check_cluster(previous: Manifest, layout: ClusterLayout, url: str) -> None:
    if previous.cluster_key != layout.store.key or previous.num_partitions != layout.num_partitions:
        raise BackupError(
            f"{url} is a backup of cluster {previous.cluster_key} ({previous.num_partitions} partitions), "
            f"not of this one ({layout.store.key}, {layout.num_partitions} partitions); "
            "give another --to"
        )
    for p, sources in layout.partitions.items():
        entry = previous.partitions.get(p)
        if entry is not None and entry.last_txid > sources.committed:
            raise BackupError(
                f"partition {p}: the backup holds transactions up to {entry.last_txid} but the "
                f"cluster has committed only up to {sources.committed}; is it the same cluster?"
            )


def _download_checked(store: BackupStore, manifest: Manifest, name: str, target: Path) -> None:
    entry = manifest.files[name]
    if store.download(name, entry.size, target) != entry.sha256:
        raise BackupError(
            f"{store.url}: {name} does not match its checksum in {manifest.name}; "
            "run 'waltz backup verify' and start a new backup elsewhere"
        )


def _first_to_copy(partition_id: int, entry: PartitionEntry, retained_start: int, committed: int) -> int:
    """Where this run's copy of a partition begins: after what the backup holds, or at the
    retained start when retention removed the head of a partition the backup holds nothing of.
    A backup whose end retention overtook cannot go on: the records between are gone."""
    begin = entry.last_txid + 1
    if retained_start <= begin or committed < begin:
        return begin
    if entry.segments:
        raise BackupError(
            f"partition {partition_id}: the backup holds transactions up to {entry.last_txid}, but retention "
            f"removed {begin}..{retained_start - 1} from every replica before they were backed up; "
            "start a new backup in an empty place (waltz backup create --to NEW_URL)"
        )
    return retained_start


def create_backup(
    access: ClusterAccess,
    url: str,
    partitions: Sequence[int] | None = None,
    *,
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
    progress: Progress | None = None,
) -> CreateSummary:
    """Back up (or bring up to date) ``partitions`` (all by default) of the cluster at ``url``."""
    started = time.monotonic()
    store = BackupStore(url)
    previous = read_latest(store)
    if previous is None:
        _check_location(store)
    layout = discover(access, partitions)
    if previous is not None:
        _check_cluster(previous, layout, url)
    store.remove_debris()
    entries = dict(previous.partitions) if previous else {}
    files = dict(previous.files) if previous else {}
    summary = CreateSummary(url, previous.sequence if previous else 0, published=False)
    total = sum(
        max(0, s.committed - entries.get(p, PartitionEntry(0, NO_TRANSACTION, ())).last_txid)
        for p, s in layout.partitions.items()
    )
    copied = 0
    key = layout.store.key
    with tempfile.TemporaryDirectory(prefix="waltz-backup-") as staging_name:
        staging = Path(staging_name)
        if previous is not None:
            _download_checked(store, previous, previous.control_file, staging / CONTROL_FILE_NAME)
        with ControlFile.open(staging / CONTROL_FILE_NAME, key, layout.num_partitions) as control:
            if previous is None:
                for p in range(layout.num_partitions):
                    control.partition_info(p).set_flag(FLAG_ASSIGNED, True)
            for p, sources in sorted(layout.partitions.items()):
                entry = entries.get(p, PartitionEntry(0, NO_TRANSACTION, ()))
                directory = staging / str(p)
                directory.mkdir()
                if entry.segments:
                    newest = entry.segments[-1]
                    for name in (newest, newest[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX):
                        _download_checked(store, previous, name, staging / name)  # type: ignore[arg-type]
                partition = Partition.open(
                    key, directory, control.partition_info(p), segment_size_threshold_bytes=segment_size_bytes
                )
                added = 0
                try:
                    begin = _first_to_copy(p, entry, sources.retained_start, sources.committed)
                    if begin > entry.last_txid + 1:
                        partition.start_at(begin)  # retention removed the head before the first backup
                    for part in sources.slices(begin, sources.committed):
                        for records in read_slice_records(part):
                            partition.append(records)
                            added += len(records)
                            copied += len(records)
                            if progress is not None:
                                progress(copied, total)
                    spans = partition.segments
                finally:
                    partition.close()
                names = sorted(
                    {*entry.segments, *(f"{p}/{segment_paths(Path(), first)[0].name}" for first, _ in spans)}
                )
                first_txid = entry.first_txid if entry.segments else spans[0][0]
                entries[p] = PartitionEntry(first_txid, spans[-1][1], tuple(names))
                summary.partitions[p] = {"first_txid": first_txid, "last_txid": spans[-1][1], "added": added}
                summary.records_added += added
                for local in sorted(directory.iterdir()):
                    name = f"{p}/{local.name}"
                    size = local.stat().st_size
                    if name in files and files[name].size == size:
                        continue  # files only grow: the same size is the same bytes
                    digest = sha256_of_file(local)
                    summary.bytes_uploaded += store.upload(local, name)
                    summary.files_uploaded += 1
                    files[name] = FileEntry(size, digest)
        if previous is None:
            ctl = staging / CONTROL_FILE_NAME
            summary.bytes_uploaded += store.upload(ctl, CONTROL_FILE_NAME)
            summary.files_uploaded += 1
            files[CONTROL_FILE_NAME] = FileEntry(ctl.stat().st_size, sha256_of_file(ctl))
    if previous is not None and not summary.files_uploaded and entries == previous.partitions:
        summary.seconds = time.monotonic() - started
        return summary
    manifest = Manifest(
        sequence=summary.sequence + 1,
        created_ms=time.time_ns() // 1_000_000,
        cluster_key=key,
        num_partitions=layout.num_partitions,
        cluster_root=access.zookeeper.cluster_root,
        control_file=CONTROL_FILE_NAME,
        partitions=entries,
        files=files,
        records_added=summary.records_added,
        bytes_uploaded=summary.bytes_uploaded,
    )
    publish(store, manifest)
    summary.sequence = manifest.sequence
    summary.published = True
    summary.seconds = time.monotonic() - started
    return summary
