"""A replica's tier manifest: which of its segments are in the object store, whole.

Each replica writes under its own prefix, ``<cluster key>/<partition>/<replica>/``, and nothing
else ever writes there: ``pyarrow.fs`` has no conditional put, so two writers of one object or
manifest could each overwrite the other's unseen. Copies of a segment differ between replicas
(their headers hold creation times), so they are never compared by bytes.

The manifest (``manifest.json``) is written after every object it names, atomically (see
``waltz_engine.common.object_store``): a node killed mid-upload leaves the previous manifest,
which names only objects uploaded and verified whole.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from waltz_engine.common.errors import StorageError
from waltz_engine.common.json_text import dumps_indented
from waltz_engine.common.object_store import FileEntry
from waltz_engine.storage.constants import INDEX_SUFFIX, SEGMENT_NAME_DIGITS, SEGMENT_SUFFIX
from waltz_engine.storage.tier.store import TierStore

FORMAT_NAME = "waltz-tier"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# Each node's temporary objects, apart from the other nodes' (it empties it when it starts).
TMP_PREFIX = ".tmp"


@dataclass(frozen=True)
class TierSegment:
    first_transaction_id: int
    max_transaction_id: int
    seg: FileEntry
    idx: FileEntry

    @property
    def size_bytes(self) -> int:
        return self.seg.size + self.idx.size

    @property
    def span(self) -> tuple[int, int]:
        return self.first_transaction_id, self.max_transaction_id

    def to_json(self) -> dict[str, Any]:
        return {
            "first_txid": self.first_transaction_id,
            "max_txid": self.max_transaction_id,
            "seg": {"size": self.seg.size, "sha256": self.seg.sha256},
            "idx": {"size": self.idx.size, "sha256": self.idx.sha256},
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> TierSegment:
        seg, idx = value["seg"], value["idx"]
        return cls(
            int(value["first_txid"]),
            int(value["max_txid"]),
            FileEntry(int(seg["size"]), str(seg["sha256"])),
            FileEntry(int(idx["size"]), str(idx["sha256"])),
        )


def replica_prefix(key: uuid.UUID, partition_id: int, replica: str) -> str:
    return f"{key}/{partition_id}/{replica}"


def object_names(prefix: str, first_transaction_id: int) -> tuple[str, str]:
    """The data and index objects of a segment: the local files' names under the prefix."""
    stem = posixpath.join(prefix, f"{first_transaction_id:0{SEGMENT_NAME_DIGITS}d}")
    return stem + SEGMENT_SUFFIX, stem + INDEX_SUFFIX


def tmp_dir(key: uuid.UUID, replica: str) -> str:
    return f"{key}/{TMP_PREFIX}/{replica}"


class TierManifest:
    """The segments of one replica's partition that are in the tier, by first txid."""

    def __init__(self, store: TierStore, prefix: str, segments: dict[int, TierSegment]) -> None:
        self.store = store
        self.prefix = prefix
        self.segments = segments

    @classmethod
    def load(cls, store: TierStore, prefix: str) -> TierManifest:
        """What the prefix's manifest names (nothing when there is no manifest yet)."""
        name = posixpath.join(prefix, MANIFEST_NAME)
        if not store.exists(name):
            return cls(store, prefix, {})
        try:
            value = json.loads(store.read_bytes(name))
            if value["format"] != FORMAT_NAME or value["version"] != FORMAT_VERSION:
                raise ValueError(f"format {value.get('format')} {value.get('version')}")
            segments = [TierSegment.from_json(s) for s in value["segments"]]
        except (ValueError, KeyError, TypeError) as e:
            raise StorageError(
                f"{store.url}/{name}: not a {FORMAT_NAME} manifest of version {FORMAT_VERSION} ({e!r}); "
                "move it away to upload this replica's segments again"
            ) from None
        return cls(store, prefix, {s.first_transaction_id: s for s in segments})

    def holds(self, first_transaction_id: int, max_transaction_id: int) -> bool:
        """Whether the segment with exactly these txids is in the tier, verified."""
        entry = self.segments.get(first_transaction_id)
        return entry is not None and entry.max_transaction_id == max_transaction_id

    def add(self, segment: TierSegment) -> None:
        """Name ``segment`` (its objects already uploaded and verified) in a new manifest."""
        segments = {**self.segments, segment.first_transaction_id: segment}
        self._publish(segments)

    def remove(self, first_transaction_ids: Iterable[int]) -> None:
        """A new manifest without these segments (their objects are deleted after it)."""
        gone = set(first_transaction_ids)
        self._publish({f: s for f, s in self.segments.items() if f not in gone})

    def _publish(self, segments: dict[int, TierSegment]) -> None:
        value = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "segments": [s.to_json() for _, s in sorted(segments.items())],
        }
        self.store.write_bytes(posixpath.join(self.prefix, MANIFEST_NAME), dumps_indented(value, 1).encode())
        self.segments = segments

    def chain_below(self, first_local_transaction_id: int) -> list[TierSegment]:
        """The segments that end right below the first local one, back to a gap: what was
        evicted, oldest first."""
        by_max = {s.max_transaction_id: s for s in self.segments.values()}
        chain: list[TierSegment] = []
        end = first_local_transaction_id - 1
        while end in by_max:
            chain.append(by_max[end])
            end = by_max[end].first_transaction_id - 1
        chain.reverse()
        return chain

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments.values())
