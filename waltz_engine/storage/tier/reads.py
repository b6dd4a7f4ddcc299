"""A partition's segments evicted to the tier, read back on demand into a bounded local cache.

A read of an evicted transaction downloads its segment's data and index objects into the
cache directory and opens them as any sealed segment: every record read is checked (CRC and
data checksum) exactly as from local files, so a flipped bit in the tier is refused as a
damaged local record is, and the server reads that record from another replica. The
partition holds its lock around these calls, as around any read of its segments.
"""

from __future__ import annotations

import bisect
import logging
import os
import signal
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from waltz_engine.common.errors import StorageError
from waltz_engine.storage.file_system import OS_DISK, Disk
from waltz_engine.storage.partition_files import local_usage
from waltz_engine.storage.segment import Segment
from waltz_engine.storage.tier.manifest import TierSegment, object_names
from waltz_engine.storage.tier.store import TierStore

log = logging.getLogger(__name__)

DOWNLOAD_SUFFIX = ".part"
# Test hook: the node kills itself (SIGKILL) at this point of the tier's work: "evict" once a
# segment's files are removed (the directory not synced yet), "read" once the data object of a
# segment being read back is downloaded (its index not yet), "cut" once a truncate into the
# evicted range removed the local segments (the new one not created yet), so tests reach those
# windows.
KILL_AT_ENV = "WALTZ_TIER_KILL_AT"
# The per-partition metrics gauge `waltz storage list` reads the disk usage from.
USAGE_GAUGE = "disk-usage"


class TierPending:
    """A partition's tier before its manifest was read (the store has not answered yet): what
    lies below the first local segment may be evicted, so it is not called removed."""

    first_transaction_id: int | None = None
    uploaded_segments = uploaded_bytes = size_bytes = 0

    def __init__(self, partition_id: int) -> None:
        self._partition_id = partition_id

    @property
    def evicted(self) -> list[TierSegment]:
        return []

    def check_known(self) -> None:
        raise StorageError(
            f"partition {self._partition_id}: the transactions below its first local segment may be in "
            "the tier, which has not answered yet; read them from another replica"
        )

    def segment_for(self, transaction_id: int) -> Segment | None:
        self.check_known()
        return None

    def forget_below(self, transaction_id: int) -> list[tuple[int, int]]:
        return []

    def note_cut(self, transaction_id: int) -> None:
        pass

    def close(self) -> None:
        pass


class TierSegments:
    """The evicted head of one partition (oldest first, contiguous up to its first local
    segment) and the segments of it read back, least recently read first."""

    def __init__(
        self,
        store: TierStore,
        prefix: str,
        key: uuid.UUID,
        partition_id: int,
        cache_directory: Path,
        cache_bytes: int,
        evicted: list[TierSegment],
        disk: Disk = OS_DISK,
    ) -> None:
        assert cache_bytes > 0
        self._store = store
        self._disk = disk
        self._prefix = prefix
        self._key = key
        self._partition_id = partition_id
        self._cache_directory = cache_directory
        self._cache_bytes = cache_bytes
        self.evicted = list(evicted)
        # What this replica's manifest names (evicted or not), as the offloader last published.
        self.uploaded_segments = 0
        self.uploaded_bytes = 0
        # The lowest txid a truncate cut since the offloader last looked (``note_cut``).
        self.cut_from: int | None = None
        # first txid → (segment, bytes of its two files)
        self._cached: OrderedDict[int, tuple[Segment, int]] = OrderedDict()
        # A cache, nothing more: what an earlier run left is not trusted.
        disk.mkdir(cache_directory, parents=True)
        self._empty_cache()

    @property
    def first_transaction_id(self) -> int | None:
        return self.evicted[0].first_transaction_id if self.evicted else None

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.evicted)

    @property
    def cached_bytes(self) -> int:
        return sum(size for _, size in self._cached.values())

    def check_known(self) -> None:
        """Below the evicted range is below the retained start."""

    def add_evicted(self, segment: TierSegment) -> None:
        """``segment`` (the first local one until now) was removed locally."""
        kill_point("evict")
        if self.evicted and self.evicted[-1].max_transaction_id + 1 != segment.first_transaction_id:
            # Retention removed the local segments in between: what is below them goes too.
            self.forget_below(segment.first_transaction_id)
        self.evicted.append(segment)

    def forget_below(self, transaction_id: int) -> list[tuple[int, int]]:
        """Retention: stop serving the evicted segments that end below ``transaction_id`` (their
        objects stay in the tier); their (first, max) txids."""
        gone = [s for s in self.evicted if s.max_transaction_id < transaction_id]
        self.evicted = self.evicted[len(gone) :]
        return self._uncache(gone)

    def forget_from(self, transaction_id: int) -> list[tuple[int, int]]:
        """A truncate: stop serving the evicted segments that end at or above ``transaction_id``
        (the records from it on are cut); their (first, max) txids. Their tier copies are void:
        noted for the offloader (``note_cut``)."""
        kept = [s for s in self.evicted if s.max_transaction_id < transaction_id]
        gone = self.evicted[len(kept) :]
        self.evicted = kept
        self.note_cut(transaction_id)
        return self._uncache(gone)

    def _uncache(self, gone: list[TierSegment]) -> list[tuple[int, int]]:
        """Delete the read-back copies of segments no longer served; their (first, max) txids."""
        for segment in gone:
            cached = self._cached.pop(segment.first_transaction_id, None)
            if cached is not None:
                cached[0].delete()
        return [s.span for s in gone]

    def note_cut(self, transaction_id: int) -> None:
        """A truncate cut the records from ``transaction_id`` on: the tier copies of segments
        holding any of them hold records no longer in the log (a later session may append other
        ones with the same txids). The offloader takes them out of the manifest on its next round
        (``take_cut``), before it uploads or evicts, so a segment grown again to the same span is
        never evicted for a copy of other bytes."""
        if self.cut_from is None or transaction_id < self.cut_from:
            self.cut_from = transaction_id

    def take_cut(self) -> int | None:
        """The lowest txid cut since the last call (see ``note_cut``), None if none."""
        cut, self.cut_from = self.cut_from, None
        return cut

    def segment_for(self, transaction_id: int) -> Segment | None:
        """The evicted segment holding ``transaction_id``, read back if it is not cached."""
        position = bisect.bisect_right(self.evicted, transaction_id, key=lambda s: s.first_transaction_id) - 1
        if position < 0 or transaction_id > self.evicted[position].max_transaction_id:
            return None
        entry = self.evicted[position]
        cached = self._cached.get(entry.first_transaction_id)
        if cached is None:
            cached = self._cached[entry.first_transaction_id] = (self._read_back(entry), entry.size_bytes)
            self._trim(keep=entry.first_transaction_id)
        self._cached.move_to_end(entry.first_transaction_id)
        cached[0].ensure_open()
        return cached[0]

    def read_copy(self, entry: TierSegment) -> Segment:
        """The tier copy of a segment still local, read back into the cache directory to be
        checked, not served (never in the cache's list): the caller deletes it."""
        assert entry.first_transaction_id not in self._cached, "an evicted segment's copy is served"
        return self._read_back(entry)

    def _read_back(self, entry: TierSegment) -> Segment:
        paths: list[Path] = []
        for name, expected in zip(
            object_names(self._prefix, entry.first_transaction_id), (entry.seg, entry.idx), strict=True
        ):
            path = self._cache_directory / name.rsplit("/", 1)[1]
            partial = path.with_name(path.name + DOWNLOAD_SUFFIX)
            digest = self._download(name, expected.size, partial)
            if digest != expected.sha256:
                # Served all the same: each record is checked when read, and only those that
                # fail are refused (the server reads them from another replica).
                log.warning(
                    "partition %d: tier object %s/%s differs from what was uploaded (sha256 %s, "
                    "expected %s); its damaged records are refused",
                    self._partition_id,
                    self._store.url,
                    name,
                    digest,
                    expected.sha256,
                )
            self._disk.rename(partial, path)
            paths.append(path)
            kill_point("read")
        return Segment.open(
            self._key,
            self._partition_id,
            paths[0],
            paths[1],
            entry.max_transaction_id,
            entry.size_bytes,
            sealed_end=entry.max_transaction_id + 1,
            disk=self._disk,
        )

    def _download(self, name: str, size: int, target: Path) -> str:
        """The object's first ``size`` bytes into the cache file ``target``; their SHA-256."""
        file = self._disk.open(target, create=True)
        try:
            file.truncate(0)
            written = 0

            def sink(chunk: bytes) -> None:
                nonlocal written
                written += file.pwrite(chunk, written)

            return self._store.download_to(name, size, sink)
        finally:
            file.close()

    def _empty_cache(self) -> None:
        for path in self._disk.glob(self._cache_directory, "*"):
            self._disk.unlink(path, missing_ok=True)

    def _trim(self, keep: int) -> None:
        """Least recently read first, down to the cache's bytes; never ``keep`` (being read)."""
        total = self.cached_bytes
        for first in list(self._cached):
            if total <= self._cache_bytes:
                break
            if first != keep:
                segment, size = self._cached.pop(first)
                segment.delete()
                total -= size

    def close(self) -> None:
        for segment, _ in self._cached.values():
            segment.close()
        self._cached.clear()
        self._empty_cache()


def kill_point(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class _Tiered(Protocol):
    directory: Path
    tier: TierSegments | TierPending | None

    @property
    def disk(self) -> Disk: ...


def disk_usage(partition: _Tiered) -> dict[str, int]:
    """Where a partition's segments are: on this node's disk, in the tier (uploaded), and in
    the tier only (evicted), with their bytes."""
    local_segments, local_bytes = local_usage(partition.directory, partition.disk)
    tier = partition.tier
    return {
        "local_segments": local_segments,
        "local_bytes": local_bytes,
        "tier_segments": tier.uploaded_segments if tier is not None else 0,
        "tier_bytes": tier.uploaded_bytes if tier is not None else 0,
        "evicted_segments": len(tier.evicted) if tier is not None else 0,
        "evicted_bytes": tier.size_bytes if tier is not None else 0,
    }
