"""A backup's manifest: what a complete backup holds, and the pointer that names the newest.

The manifest of each completed run is a new object ``manifests/<sequence>.json``, written after
every file it names; then the small pointer object :data:`POINTER_NAME` is replaced to name it.
Both writes are atomic per file (see :mod:`.store`), so a reader sees the previous complete
backup until the pointer moves, and the new one after. A manifest names each file with its
size and the SHA-256 of that many first bytes (files only grow, see :mod:`.store`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.object_store import FileEntry
from waltz_engine.ops.backup.store import BackupStore, BackupStoreError

FORMAT_NAME = "waltz-backup"
FORMAT_VERSION = 1
POINTER_NAME = "LATEST"
MANIFEST_DIR = "manifests"
SEQUENCE_DIGITS = 10
NO_TRANSACTION = -1


class BackupError(WaltzError):
    """A backup is missing, damaged or does not fit what was asked."""


@dataclass(frozen=True)
class PartitionEntry:
    first_txid: int  # the first transaction held (0 unless the cluster's head was removed)
    last_txid: int  # NO_TRANSACTION when none is held
    segments: tuple[str, ...]  # the data files ("<p>/<first txid>.seg"), oldest first

    @property
    def records(self) -> int:
        return max(0, self.last_txid - self.first_txid + 1)

    def files(self) -> list[str]:
        return [name for seg in self.segments for name in (seg, seg[: -len(".seg")] + ".idx")]


@dataclass(frozen=True)
class Manifest:
    sequence: int
    created_ms: int
    cluster_key: uuid.UUID
    num_partitions: int
    cluster_root: str
    control_file: str
    partitions: dict[int, PartitionEntry]
    files: dict[str, FileEntry]
    records_added: int = 0  # by the run that wrote this manifest
    bytes_uploaded: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return manifest_name(self.sequence)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "sequence": self.sequence,
            "created_ms": self.created_ms,
            "cluster_key": str(self.cluster_key),
            "num_partitions": self.num_partitions,
            "cluster_root": self.cluster_root,
            "control_file": self.control_file,
            "records_added": self.records_added,
            "bytes_uploaded": self.bytes_uploaded,
            "partitions": {
                str(p): {"first_txid": e.first_txid, "last_txid": e.last_txid, "segments": list(e.segments)}
                for p, e in sorted(self.partitions.items())
            },
            "files": {n: {"size": f.size, "sha256": f.sha256} for n, f in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, value: dict[str, Any], where: str) -> Manifest:
        try:
            if value["format"] != FORMAT_NAME or value["version"] != FORMAT_VERSION:
                raise BackupError(
                    f"{where}: not a {FORMAT_NAME} manifest of version {FORMAT_VERSION} "
                    f"(found {value.get('format')} {value.get('version')})"
                )
            return cls(
                sequence=int(value["sequence"]),
                created_ms=int(value["created_ms"]),
                cluster_key=uuid.UUID(value["cluster_key"]),
                num_partitions=int(value["num_partitions"]),
                cluster_root=str(value["cluster_root"]),
                control_file=str(value["control_file"]),
                partitions={
                    int(p): PartitionEntry(int(e["first_txid"]), int(e["last_txid"]), tuple(e["segments"]))
                    for p, e in value["partitions"].items()
                },
                files={n: FileEntry(int(f["size"]), str(f["sha256"])) for n, f in value["files"].items()},
                records_added=int(value.get("records_added", 0)),
                bytes_uploaded=int(value.get("bytes_uploaded", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BackupError(f"{where}: the manifest is malformed ({e!r})") from None


def manifest_name(sequence: int) -> str:
    return f"{MANIFEST_DIR}/{sequence:0{SEQUENCE_DIGITS}d}.json"


def read_latest(store: BackupStore) -> Manifest | None:
    """The manifest the pointer names; None when no run has completed there yet."""
    if not store.exists(POINTER_NAME):
        return None
    where = f"{store.url}/{POINTER_NAME}"
    try:
        name = json.loads(store.read_bytes(POINTER_NAME))["manifest"]
        return Manifest.from_json(json.loads(store.read_bytes(name)), f"{store.url}/{name}")
    except (ValueError, KeyError, TypeError) as e:
        raise BackupError(f"{where}: unreadable ({e!r}); the backup is damaged") from None
    except BackupStoreError as e:
        raise BackupError(f"{where} names a manifest that cannot be read: {e}") from None


def require_latest(store: BackupStore) -> Manifest:
    manifest = read_latest(store)
    if manifest is None:
        raise BackupError(
            f"{store.url}: no backup there (no {POINTER_NAME}); check the URL, or run 'waltz backup create'"
        )
    return manifest


def publish(store: BackupStore, manifest: Manifest) -> None:
    """Write the manifest, then move the pointer to it: the run's commit point."""
    store.write_bytes(manifest.name, (json.dumps(manifest.to_json(), indent=1) + "\n").encode())
    store.write_bytes(POINTER_NAME, (json.dumps({"manifest": manifest.name}) + "\n").encode())


def describe_backup(url: str) -> dict[str, Any]:
    """What the backup at ``url`` holds (its newest complete run), JSON-ready."""
    store = BackupStore(url)
    manifest = require_latest(store)
    sizes: dict[int, int] = {}
    for p, entry in manifest.partitions.items():
        sizes[p] = sum(manifest.files[name].size for name in entry.files() if name in manifest.files)
    return {
        "url": url,
        "sequence": manifest.sequence,
        "created_ms": manifest.created_ms,
        "cluster_key": str(manifest.cluster_key),
        "cluster_root": manifest.cluster_root,
        "num_partitions": manifest.num_partitions,
        "files": len(manifest.files),
        "bytes": sum(f.size for f in manifest.files.values()),
        "runs": len(store.list_names(MANIFEST_DIR)),
        "partitions": [
            {
                "partition": p,
                "first_txid": e.first_txid,
                "last_txid": e.last_txid,
                "records": e.records,
                "segments": len(e.segments),
                "bytes": sizes[p],
            }
            for p, e in sorted(manifest.partitions.items())
        ],
    }
