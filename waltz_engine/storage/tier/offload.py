"""The storage node's tier task: every ``storage.tier.check.interval.ms``, for each partition
it holds, upload the sealed segments that lie wholly at or below the local low-water mark and
are not in the tier yet, then evict the oldest uploaded ones while the partition's local files
exceed ``storage.tier.local.bytes``.

A segment rolls in the middle of a batch, so a sealed segment can hold records that never
reached a quorum and that recovery will truncate: only what a store session found on this node
when it started (the local low-water mark) is known committed. Before an upload the segment's
records are read and checked (a damaged segment is not uploaded, and so never evicted); after
it, the object's SHA-256 is read back and compared; then the manifest names it. A node killed
anywhere leaves the previous manifest, temporary objects it removes when it starts again, and
its local files (nothing is removed locally before the manifest names it). Last, retention
(:mod:`waltz_engine.storage.tier.retention`) removes the tier copies below the partition's bound.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from waltz_engine.common import clock
from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.common.limited_log import LimitedLog
from waltz_engine.common.object_store import FileEntry
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.storage.constants import segment_paths
from waltz_engine.storage.file_system import OS_DISK, Disk
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.segment import CorruptRecordError
from waltz_engine.storage.tier.manifest import (
    TierManifest,
    TierSegment,
    object_names,
    replica_prefix,
    tmp_dir,
)
from waltz_engine.storage.tier.reads import TierPending, TierSegments
from waltz_engine.storage.tier.retention import remove_below, sweep
from waltz_engine.storage.tier.settings import KEY_TIER_URL, TierSettings
from waltz_engine.storage.tier.store import OBJECT_STORE_TIER, TierSeam, TierStore

if TYPE_CHECKING:  # the node package imports this module
    from waltz_engine.storage.node.partition_worker import PartitionWorker

log = logging.getLogger(__name__)
# A store down or a damaged segment is met again every round.
_warnings = LimitedLog(log)

# Where evicted segments are read back: a directory of the storage directory, apart from the
# partitions' (a Java node ignores it).
CACHE_DIRECTORY = ".tier-cache"
# Records per read when a segment's records are checked before its upload.
CHECK_BATCH_RECORDS = 4096
# Bytes per write of an upload: the rate limit sleeps between them.
UPLOAD_CHUNK_BYTES = 256 * 1024


class OffloadStopped(WaltzError):
    """The node is stopping: the upload in progress is abandoned (its debris removed at start)."""


class RateLimit:
    """At most ``bytes_per_second``: :meth:`take` sleeps until the bytes taken so far are due.
    Time spent idle is not saved up for a burst. Not ``blocking`` (the simulator's seam,
    :class:`~waltz_engine.storage.tier.store.TierSeam`), it never sleeps: :meth:`take_owed_s`
    says how long the caller must sleep on its loop instead."""

    def __init__(self, bytes_per_second: int, stopping: threading.Event, blocking: bool = True) -> None:
        self._bytes_per_second = bytes_per_second
        self._stopping = stopping
        self._blocking = blocking
        self._due_s = 0.0
        self._owed_s = 0.0

    def take(self, size_bytes: int) -> None:
        now = clock.monotonic_s()
        self._due_s = max(self._due_s, now) + size_bytes / self._bytes_per_second
        if not self._blocking:
            self._owed_s = max(self._owed_s, self._due_s - now)
            if self._stopping.is_set():
                raise OffloadStopped("node stopping")
        elif self._stopping.wait(self._due_s - now):
            raise OffloadStopped("node stopping")

    def take_owed_s(self) -> float:
        """The wait the bytes taken since the last call owe (0 where :meth:`take` slept)."""
        owed, self._owed_s = self._owed_s, 0.0
        return owed


def replica_name(host: str, port: int) -> str:
    """This node's prefix in the tier: its host (the machine's name when it listens on every
    address) and data port."""
    name = host if host not in ("", "0.0.0.0", "::") else socket.gethostname()
    return f"{name}_{port}"


class TierOffloader:
    def __init__(
        self,
        settings: TierSettings,
        key: uuid.UUID,
        replica: str,
        storage_directory: Path,
        workers: Callable[[], Mapping[int, PartitionWorker]],
        disk: Disk = OS_DISK,
        seam: TierSeam = OBJECT_STORE_TIER,
    ) -> None:
        self.settings = settings
        self._disk = disk
        self._seam = seam
        self._key = key
        self._replica = replica
        self._cache_root = storage_directory / CACHE_DIRECTORY
        self._workers = workers
        self._store: TierStore | None = None
        self._manifests: dict[int, TierManifest] = {}
        # Partitions whose prefix was swept since the start (what a killed removal left).
        self._swept: set[int] = set()
        # By partition, the local segments whose tier copy this process uploaded or found equal to
        # the local files: only those are evicted for (``_verify_local_copies``).
        self._verified: dict[int, set[int]] = {}
        self._stopping = threading.Event()
        self._rate = RateLimit(settings.bytes_per_second, self._stopping, seam.blocking_rate)
        self._task: asyncio.Task[None] | None = None
        # A round and a scrub's check of a copy both rewrite manifests: one at a time.
        self._manifest_lock = asyncio.Lock()

    def open_store(self) -> None:
        """Reach the store and remove this node's temporary debris (blocking)."""
        tmp = tmp_dir(self._key, self._replica)
        store = self._seam.open_store(self.settings.url, f"'{KEY_TIER_URL}'", tmp)
        store.remove_debris()
        self._store = store

    def attach(self, partition: Partition) -> None:
        """Give ``partition`` what it evicted to the tier (from its manifest; blocking). A
        partition not attached reads only its local segments."""
        if isinstance(partition.tier, TierSegments):
            return
        partition.tier = TierPending(partition.partition_id)
        if self._store is None:
            raise StorageError(f"{self.settings.url}: not reached yet")
        manifest = self._manifest(partition.partition_id)
        local_first = partition.segments[0][0]
        tier = TierSegments(
            self._store,
            manifest.prefix,
            self._key,
            partition.partition_id,
            self._cache_root / str(partition.partition_id),
            self.settings.cache_bytes,
            manifest.chain_below(local_first),
            self._disk,
        )
        tier.uploaded_segments, tier.uploaded_bytes = len(manifest.segments), manifest.size_bytes
        partition.tier = tier

    def _manifest(self, partition_id: int) -> TierManifest:
        manifest = self._manifests.get(partition_id)
        if manifest is None:
            assert self._store is not None
            prefix = replica_prefix(self._key, partition_id, self._replica)
            manifest = self._manifests[partition_id] = TierManifest.load(self._store, prefix)
        return manifest

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tier-offload")

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                if self._store is None:
                    await asyncio.to_thread(self.open_store)
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except OffloadStopped:
                return
            except (WaltzError, OSError) as e:
                log.warning("tier: %s; trying again in %d ms", e, self.settings.check_interval_ms)
            await asyncio.sleep(self.settings.check_interval_ms / 1000)

    async def run_once(self) -> None:
        """One round over every partition held (uploads, evictions, then retention)."""
        for partition_id, worker in sorted(self._workers().items()):
            partition = worker.partition
            if partition is None:
                continue
            try:
                async with self._manifest_lock:
                    try:
                        await asyncio.to_thread(self._offload, partition, worker.retention_bound)
                    finally:
                        await asyncio.sleep(self._rate.take_owed_s())
            except OffloadStopped:
                raise
            except (WaltzError, OSError) as e:
                # Unassigned or closed meanwhile, the store down, a disk error: next round.
                message = f"tier: partition {partition_id}: {e}; trying again next round"
                _warnings.warn(str(partition_id), message)

    def _offload(self, partition: Partition, retention_bound: int | None) -> None:
        """``retention_bound``: the partition's effective retention bound, None while unknown."""
        self.attach(partition)
        manifest = self._manifest(partition.partition_id)
        verified = self._verified.setdefault(partition.partition_id, set())
        verified.difference_update(self._drop_cut(partition, manifest))
        local_low_water_mark = partition.info.current.local_low_water_mark
        for first, last in partition.segments[:-1]:
            if last > local_low_water_mark:
                break
            if retention_bound is not None and last < retention_bound:
                continue  # retention removes it: not worth an upload
            if first not in manifest.segments and self._records_whole(partition, first, last):
                manifest.add(self._upload(partition, manifest.prefix, first, last))
                verified.add(first)
                self._count(partition, manifest)
        if self.settings.local_bytes:
            self._verify_local_copies(partition, manifest, verified)

            def in_tier(first: int, last: int) -> TierSegment | None:
                held = first in verified and manifest.holds(first, last)
                return manifest.segments[first] if held else None

            evicted = partition.evict_to_tier(self.settings.local_bytes, in_tier)
            if evicted:
                log.info(
                    "tier: partition %d: %d segment(s) now only in the tier", partition.partition_id, evicted
                )

        if retention_bound is not None:
            self._retain(partition, manifest, retention_bound)

    def _drop_cut(self, partition: Partition, manifest: TierManifest) -> list[int]:
        """Take out of the manifest the copies of segments a truncate cut since the last round:
        they hold records no longer in the log, and a segment grown again to the same span must
        be uploaded anew, never evicted for them. Their objects stay until a sweep or an upload
        of the same segment replaces them. The first txids of those taken out."""
        tier = partition.tier
        if not isinstance(tier, TierSegments):
            return []
        cut = partition.take_tier_cut()
        if cut is None:
            return []
        void = [first for first, s in manifest.segments.items() if s.max_transaction_id >= cut]
        if void:
            try:
                manifest.remove(void)
            except BaseException:
                tier.note_cut(cut)  # the store did not take it: next round
                raise
            self._count(partition, manifest)
            log.info(
                "tier: partition %d: %d segment copy(ies) from transaction %d on left the manifest "
                "(the log was truncated there)",
                partition.partition_id,
                len(void),
                cut,
            )
        return void

    def _verify_local_copies(self, partition: Partition, manifest: TierManifest, verified: set[int]) -> None:
        """Compare the tier copies of local segments at or below the mark that this process has not
        uploaded with the local files (once each): a copy that differs from a local segment whose
        records are whole leaves the manifest, to be uploaded again. A node killed after a
        truncate and before its next round (``_drop_cut``) kept in its manifest copies of segments
        the truncate cut; one grown again to the same span with other bytes was evicted for them,
        and the old bytes served. A copy of a damaged local segment stays and is evicted for
        (the repair: reads come from the copy) when its records are whole and equal every record
        the local segment holds whole (``_repairs``)."""
        local_low_water_mark = partition.info.current.local_low_water_mark
        for first, last in partition.segments[:-1]:
            if last > local_low_water_mark:
                break
            entry = manifest.segments.get(first)
            if entry is None or first in verified:
                continue
            why = self._differs(partition, entry, first, last)
            if why is None:
                verified.add(first)
                continue
            log.warning(
                "tier: partition %d: the copy of segment %d..%d in the tier %s; uploading it again",
                partition.partition_id,
                first,
                entry.max_transaction_id,
                why,
            )
            manifest.remove([first])
            self._count(partition, manifest)

    def _differs(self, partition: Partition, entry: TierSegment, first: int, last: int) -> str | None:
        """Why the tier copy ``entry`` is not the local segment ``first``..``last``; None when it
        is (its files are the local files, or the local segment is damaged and the copy repairs it)."""
        if entry.span != (first, last):
            return f"is not the local segment {first}..{last}"
        paths = segment_paths(partition.directory, first)
        if [self._file_entry(p) for p in paths] == [entry.seg, entry.idx]:
            return None
        if self._damage_in(partition, first, last) is None:
            return "differs from the local segment, whose records are whole"
        return self._repairs(partition, entry, first, last)

    def _repairs(self, partition: Partition, entry: TierSegment, first: int, last: int) -> str | None:
        """A damaged local segment's copy: None when its records are whole and equal each record
        the local segment holds whole (the copy is what repairs it), else why not. The rot must
        not cost the good copy: the local segment cannot be uploaded again (``_records_whole``)."""
        tier = partition.tier
        assert isinstance(tier, TierSegments)
        copy = tier.read_copy(entry)
        try:
            transaction_id = first
            while transaction_id <= last:
                count = min(CHECK_BATCH_RECORDS, last - transaction_id + 1)
                try:  # short where a record is damaged: the next read starts there, and raises
                    theirs = copy.read_records(transaction_id, count)
                except CorruptRecordError as e:
                    return f"is damaged too ({e})"
                mine = partition.whole_records(first, transaction_id, len(theirs))
                if mine is None or not theirs:
                    return f"holds fewer transactions than the local segment {first}..{last}"
                for record in theirs:
                    held = mine.get(record.transaction_id)
                    if held is not None and held != record:
                        return f"holds another transaction {record.transaction_id} than the local segment"
                transaction_id += len(theirs)
        finally:
            copy.delete()
        log.warning(
            "tier: partition %d: local segment %d..%d is damaged; its copy in the tier holds every "
            "record it holds whole: kept, and the segment is evicted for it",
            partition.partition_id,
            first,
            last,
        )
        return None

    def _file_entry(self, path: Path) -> FileEntry:
        """A local file's size and SHA-256, read through the node's disk."""
        digest, size = hashlib.sha256(), 0
        for chunk in self._chunks(path):
            digest.update(chunk)
            size += len(chunk)
        return FileEntry(size, digest.hexdigest())

    def _retain(self, partition: Partition, manifest: TierManifest, bound: int) -> None:
        """Retention in the tier, below what the partition still serves (so no read of it
        looks for a deleted object)."""
        assert self._store is not None
        end = min(bound, partition.first_transaction_id())
        removed = remove_below(manifest, end)
        if removed or partition.partition_id not in self._swept:
            sweep(self._store, manifest, end)
            self._swept.add(partition.partition_id)
        if removed:
            self._count(partition, manifest)
            log.info(
                "tier: partition %d: retention removed %d segment(s) with transactions %d..%d "
                "from the tier (effective bound %d)",
                partition.partition_id,
                len(removed),
                removed[0][0],
                removed[-1][1],
                bound,
            )

    @staticmethod
    def _count(partition: Partition, manifest: TierManifest) -> None:
        if partition.tier is not None:
            partition.tier.uploaded_segments = len(manifest.segments)
            partition.tier.uploaded_bytes = manifest.size_bytes

    def local_copies(self, partition: Partition) -> list[int]:
        """The first txids of the partition's segments in the tier that are also local (the
        scrub checks their copies; the evicted ones are checked as it reads them)."""
        manifest = self._manifests.get(partition.partition_id)
        if manifest is None or not isinstance(partition.tier, TierSegments):
            return []
        evicted = {s.first_transaction_id for s in partition.tier.evicted}
        return [first for first in sorted(manifest.segments) if first not in evicted]

    async def check_copy(self, partition: Partition, first: int) -> int:
        """Compare the tier copy of local segment ``first`` with the SHA-256 its manifest names;
        one that differs leaves the manifest, so the next round uploads it again from the local
        file (which is never evicted meanwhile: only what the manifest names is). The bytes read."""
        async with self._manifest_lock:
            if first not in self.local_copies(partition):
                return 0  # evicted or removed meanwhile
            return await asyncio.to_thread(self._check_copy, partition, first)

    def _check_copy(self, partition: Partition, first: int) -> int:
        assert self._store is not None
        manifest = self._manifests[partition.partition_id]
        entry = manifest.segments[first]
        for name, expected in zip(object_names(manifest.prefix, first), (entry.seg, entry.idx), strict=True):
            digest = self._store.checksum(name, expected.size)
            if digest != expected.sha256:
                log.warning(
                    "tier: partition %d: %s/%s differs from what was uploaded (sha256 %s, expected %s); "
                    "uploading the segment again from its local files",
                    partition.partition_id,
                    self._store.url,
                    name,
                    digest,
                    expected.sha256,
                )
                manifest.remove([first])
                self._count(partition, manifest)
                break
        return entry.size_bytes

    def _records_whole(self, partition: Partition, first: int, last: int) -> bool:
        damage = self._damage_in(partition, first, last)
        if damage is not None:
            where = f"segment {first} of partition {partition.partition_id}"
            _warnings.warn(where, f"tier: not uploading {where}: {damage}")
        return damage is None

    @staticmethod
    def _damage_in(partition: Partition, first: int, last: int) -> CorruptRecordError | None:
        """The first damaged record of the local segment ``first``..``last`` (read a batch at a
        time, in bounded memory), None when every record reads whole."""
        transaction_id = first
        try:
            while transaction_id <= last:
                read = partition.records_wire(
                    transaction_id, min(CHECK_BATCH_RECORDS, last - transaction_id + 1)
                )
                if not read.num_records:
                    raise StorageError(f"transaction {transaction_id} is not there")
                transaction_id += read.num_records
        except CorruptRecordError as e:
            return e
        return None

    def _upload(self, partition: Partition, prefix: str, first: int, last: int) -> TierSegment:
        store = self._store
        assert store is not None
        uploaded: list[FileEntry] = []
        for path, name in zip(
            segment_paths(partition.directory, first), object_names(prefix, first), strict=True
        ):
            digest = hashlib.sha256()
            for chunk in self._chunks(path):
                digest.update(chunk)
            size = store.upload_chunks(self._chunks(path), name, self._rate.take)
            if store.checksum(name, size) != digest.hexdigest():
                raise StorageError(
                    f"{store.url}/{name}: the uploaded object differs from {path}; uploading again"
                )
            uploaded.append(FileEntry(size, digest.hexdigest()))
        return TierSegment(first, last, uploaded[0], uploaded[1])

    def _chunks(self, path: Path) -> Iterator[bytes]:
        """A local file's bytes, read through the node's disk a chunk at a time."""
        file = self._disk.open(path)
        try:
            offset = 0
            while chunk := file.pread(UPLOAD_CHUNK_BYTES, offset):
                yield chunk
                offset += len(chunk)
        finally:
            file.close()
