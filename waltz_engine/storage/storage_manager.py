"""The storage directory as a whole: the control file plus every assigned partition.

A later issue builds the network node on this; it offers what the original's
``StorageManager`` does: validate OPEN, find a partition, assign/unassign partitions and
toggle their availability. Thread-safe: one lock guards the partition map; each
partition serializes its own operations (see ``partition.py``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from waltz_engine.common.errors import StorageError
from waltz_engine.disk.partition_info import FLAG_ASSIGNED, FLAG_AVAILABLE
from waltz_engine.storage.constants import (
    CONTROL_FILE_NAME,
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
    now_ms,
)
from waltz_engine.storage.control_file import ControlFile, PartitionInfo
from waltz_engine.storage.file_system import OS_DISK, READ_ONLY_OS_DISK, Disk
from waltz_engine.storage.partition import Partition


class StorageManager:
    """Open with the cluster key and partition count from ZooKeeper's StoreParams."""

    def __init__(
        self,
        directory: Path,
        key: uuid.UUID,
        num_partitions: int,
        *,
        segment_size_threshold_bytes: int = DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
        segment_cache_capacity: int = DEFAULT_SEGMENT_CACHE_CAPACITY,
        clock_ms: Callable[[], int] = now_ms,
        disk: Disk = OS_DISK,
        read_only: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.read_only = read_only
        self._disk = disk
        self._threshold_bytes = segment_size_threshold_bytes
        self._cache_capacity = segment_cache_capacity
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._partitions: dict[int, Partition] = {}
        self._running = True
        self.control_file = ControlFile.open(
            self.directory / CONTROL_FILE_NAME,
            key,
            num_partitions,
            clock_ms=clock_ms,
            disk=disk,
            read_only=read_only,
        )
        try:
            for partition_id in range(self.control_file.num_partitions):
                if self.control_file.partition_info(partition_id).is_assigned:
                    self._create_partition(partition_id)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open_read_only(cls, directory: Path, key: uuid.UUID, num_partitions: int) -> StorageManager:
        """The one read-only open of a stopped node's directory, for every command that only checks.

        The same checks as a node's start, and nothing written: no directory or segment 0
        created, no interrupted file cleaned, no torn tail cut, no index rebuilt, the control
        file opened read-only under a shared lock (a running node's lock refuses it). What a
        writing open would have changed is in each partition's ``findings``; the damage it
        keeps in ``damage_report()``. Only for reading; any write is a bug and fails.
        """
        return cls(directory, key, num_partitions, disk=READ_ONLY_OS_DISK, read_only=True)

    def findings(self) -> dict[int, list[str]]:
        """Per assigned partition, what a writing open would change and the damage it would keep
        (empty lists: nothing); one line each."""
        with self._lock:
            self._check_running()
            partitions = dict(self._partitions)
        return {
            p: [*partition.findings, *(d.describe() for d in partition.damage_report())]
            for p, partition in sorted(partitions.items())
        }

    @property
    def key(self) -> uuid.UUID:
        return self.control_file.key

    @property
    def num_partitions(self) -> int:
        return self.control_file.num_partitions

    def _check_running(self) -> None:
        if not self._running:
            raise StorageError("Control file is already closed.")

    def open(self, key: uuid.UUID, num_partitions: int) -> None:
        """Validate an OPEN request (data or admin port) against the control file."""
        with self._lock:
            self._check_running()
            if key != self.key:
                raise StorageError("Provided cluster key is inconsistent with key in control file.")
            if num_partitions != self.num_partitions:
                raise StorageError(
                    "Provided number of partitions is inconsistent with the total number of "
                    "partitions in control file."
                )

    def partition(self, partition_id: int) -> Partition:
        """The open partition, or StorageError when it is not assigned on this node."""
        with self._lock:
            self._check_running()
            partition = self._partitions.get(partition_id)
            if partition is None:
                raise StorageError(f"Partition:{partition_id} is not assigned.")
            return partition

    def partition_info(self, partition_id: int) -> PartitionInfo:
        return self.control_file.partition_info(partition_id)

    def assigned_partition_ids(self) -> list[int]:
        with self._lock:
            self._check_running()
            return sorted(self._partitions)

    def assigned_partition_status(self) -> dict[int, bool]:
        """ASSIGNED_PARTITION_STATUS: for every assigned partition, whether it is also available."""
        return {
            p: self.partition_info(p).is_available
            for p in range(self.num_partitions)
            if self.partition_info(p).is_assigned
        }

    def _create_partition(self, partition_id: int) -> None:
        if partition_id in self._partitions:
            return
        self._partitions[partition_id] = Partition.open(
            self.key,
            self.directory / str(partition_id),
            self.control_file.partition_info(partition_id),
            segment_size_threshold_bytes=self._threshold_bytes,
            segment_cache_capacity=self._cache_capacity,
            clock_ms=self._clock_ms,
            disk=self._disk,
            read_only=self.read_only,
        )

    def set_partition_assignment(
        self, partition_ids: Iterable[int], assigned: bool, delete_storage_files: bool = False
    ) -> None:
        """PARTITION_ASSIGNMENT: assign (create dir + first segment, set ASSIGNED) or unassign
        (reset the control structs, close, optionally delete the segment files)."""
        assert not self.read_only
        with self._lock:
            self._check_running()
            for partition_id in partition_ids:
                info = self.control_file.partition_info(partition_id)
                if assigned:
                    self._create_partition(partition_id)
                    info.set_flag(FLAG_ASSIGNED, True)
                    continue
                info.reset()
                partition = self._partitions.pop(partition_id, None)
                if partition is not None:
                    partition.close()
                    if delete_storage_files:
                        partition.delete_segments()

    def set_partition_available(self, partition_ids: Iterable[int], available: bool) -> None:
        """PARTITION_AVAILABLE: set or clear the AVAILABLE flag of each partition (persisted)."""
        assert not self.read_only
        with self._lock:
            self._check_running()
            for partition_id in partition_ids:
                self.control_file.partition_info(partition_id).set_flag(FLAG_AVAILABLE, available)

    def close(self) -> None:
        with self._lock:
            if not self._running:
                return
            self._running = False
            for partition in self._partitions.values():
                partition.close()
            self._partitions.clear()
            self.control_file.close()

    def __enter__(self) -> StorageManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
