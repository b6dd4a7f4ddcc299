"""Shared helpers for the storage engine's tests."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.storage import StorageManager
from waltz_engine.storage.constants import (
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
)
from waltz_engine.storage.file_system import OS_DISK


def open_one_partition(
    directory: Path,
    key: uuid.UUID,
    *,
    records_per_segment: int | None = None,
    record_bytes: int = 0,
    segment_size_threshold_bytes: int = DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
    segment_cache_capacity: int = DEFAULT_SEGMENT_CACHE_CAPACITY,
) -> StorageManager:
    """A one-partition store with partition 0 assigned; with ``records_per_segment``, segments
    roll over after that many records of ``record_bytes`` each (else past the threshold)."""
    if records_per_segment is not None:
        segment_size_threshold_bytes = HEADER_SIZE_BYTES + (records_per_segment - 1) * record_bytes
    manager = StorageManager(
        directory,
        key,
        1,
        segment_size_threshold_bytes=segment_size_threshold_bytes,
        segment_cache_capacity=segment_cache_capacity,
    )
    if not manager.assigned_partition_ids():
        manager.set_partition_assignment([0], True)
    return manager


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` of ``path`` in place (what rot or a forger does to a file)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


class FaultyDisk:
    """The OS disk with faults in the files of chosen directories: an ``fdatasync`` that fails
    (EIO, ``failing``) or waits for ``release`` (``slow``), writes that fail (``failing_writes``);
    and whole-disk syncs (``syncfs``) that fail (the next ``failing_whole_syncs``). Syncs counted."""

    def __init__(self) -> None:
        self.failing: set[Path] = set()
        self.slow: set[Path] = set()
        self.slow_started = threading.Event()
        self.release = threading.Event()
        self.failing_writes: set[Path] = set()
        self.failing_whole_syncs = 0
        self.whole_syncs = 0
        self.file_syncs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(OS_DISK, name)

    def open(self, path: Path, **kwargs: bool) -> Any:
        return _FaultyFile(self, path, OS_DISK.open(path, **kwargs))

    def whole_sync(self, directory: Path) -> _FaultyWholeSync:
        return _FaultyWholeSync(self, directory)

    def sync_all(self, directory: Path) -> None:
        """One whole-disk sync through a handle of its own (the tests' passes)."""
        whole = self.whole_sync(directory)
        try:
            whole.sync()
        finally:
            whole.close()


class _FaultyWholeSync:
    def __init__(self, disk: FaultyDisk, directory: Path) -> None:
        self._disk, self._directory = disk, directory
        self._real = OS_DISK.whole_sync(directory)

    def sync(self) -> None:
        self._disk.whole_syncs += 1
        if self._disk.failing_whole_syncs:
            self._disk.failing_whole_syncs -= 1
            raise OSError(errno.EIO, "Input/output error", str(self._directory))
        self._real.sync()

    def close(self) -> None:
        self._real.close()


class _FaultyFile:
    def __init__(self, disk: FaultyDisk, path: Path, file: Any) -> None:
        self._disk, self._path, self._file = disk, path, file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def pwrite(self, data: bytes, offset: int) -> int:
        if self._path.parent in self._disk.failing_writes:
            raise OSError(errno.EIO, "Input/output error", str(self._path))
        return int(self._file.pwrite(data, offset))

    def fdatasync(self) -> None:
        self._disk.file_syncs += 1
        if self._path.parent in self._disk.failing:
            raise OSError(errno.EIO, "Input/output error", str(self._path))
        if self._path.parent in self._disk.slow:
            self._disk.slow_started.set()
            self._disk.release.wait()
        self._file.fdatasync()
