"""A segment's files on their own: creating an empty one, the first txid its name gives, and the
error a corrupt record is refused with (``segment.py`` re-exports them)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path

from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.common.fileio import pwrite_all
from waltz_engine.disk.file_header import FORMAT_VERSION, SegmentFileHeader
from waltz_engine.disk.segment_reader import first_txid_from_name
from waltz_engine.storage.file_system import OS_DISK, Disk

# What a corrupt record's error says first; the server recognises the storage FAILURE by it
# (``waltz_engine.server.store.store_session``) and reads the record from another replica.
CORRUPT_RECORD_MESSAGE = "corrupt record"


class CorruptRecordError(StorageError):
    """A record fails its CRC (over header and data) or its data checksum: never served.

    A ``StorageError``, so the node answers the request with a FAILURE naming the record.
    """

    def __init__(
        self, partition_id: int, transaction_id: int, seg_path: Path, offset: int, what: str
    ) -> None:
        super().__init__(
            f"{CORRUPT_RECORD_MESSAGE}: partition {partition_id} transaction {transaction_id}: {what} "
            f"({seg_path} offset {offset})"
        )
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.what = what


def first_transaction_id_of(seg_path: Path) -> int:
    """The first txid a segment holds, from its name: what the partition orders segments by."""
    first = first_txid_from_name(seg_path)
    if first is None:
        raise FormatError(f"unexpected segment file name: {seg_path}")
    return first


def create_segment_files(
    key: uuid.UUID,
    partition_id: int,
    seg_path: Path,
    idx_path: Path,
    first_transaction_id: int,
    clock_ms: Callable[[], int],
    disk: Disk = OS_DISK,
) -> None:
    """Create an empty segment: the index header first, then the data header, each synced.

    Each file takes its own creation time, as the original's. A creation that fails (a full
    disk) removes what it created, so the next roll-over creates the segment again; before, the
    index left behind failed every later attempt with EEXIST, after the disk had room again.
    """
    created: list[Path] = []
    try:
        for path in (idx_path, seg_path):
            header = SegmentFileHeader(FORMAT_VERSION, clock_ms(), key, partition_id, first_transaction_id)
            file = disk.open(path, create=True, exclusive=True)
            created.append(path)
            try:
                pwrite_all(file, header.to_bytes(), 0)
                file.fsync()
            finally:
                file.close()
        disk.fsync_directory(seg_path.parent)
    except OSError:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                disk.unlink(path, missing_ok=True)
        raise
