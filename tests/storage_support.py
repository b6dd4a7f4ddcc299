"""Shared helpers for the storage engine's tests."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.storage import StorageManager
from waltz_engine.storage.constants import (
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
)


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
