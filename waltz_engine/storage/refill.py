"""Replacing a damaged segment with a copy written from a healthy replica's records (issue 13, item 2).

``waltz storage recover-partition`` sends every record of a damaged segment, in order and in
batches, as offline-recovery APPENDs of transactions the destination already holds. The
partition writes them to ``<segment>.seg.refill`` and ``<segment>.idx.refill`` (the original's
format: the same header, records and index entries the segment had before it was damaged) and
only once the last record is in, swaps the copy in: both files synced, renamed over the old
ones (data first), the directory synced. Until then not a byte of the old segment changes.

A crash leaves one of three states, which :func:`clean_interrupted_refills` settles at open:
both ``.refill`` files (the copy was not swapped in: dropped, the old segment is whole as it
was), the index's alone (the data file was swapped in, the index not yet: it is renamed in
too), or the data's alone (a copy just begun: dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from waltz_engine.common.fileio import pwrite_all
from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import INDEX_ENTRY_SIZE_BYTES, encode_records
from waltz_engine.storage.constants import INDEX_SUFFIX, SEGMENT_SUFFIX
from waltz_engine.storage.file_system import CLOSED_FILE, Disk

log = logging.getLogger(__name__)

REFILL_SUFFIX = ".refill"


def refill_path(path: Path) -> Path:
    """Where the copy of a segment file (``.seg`` or ``.idx``) is written."""
    return path.with_name(path.name + REFILL_SUFFIX)


def clean_interrupted_refills(directory: Path, disk: Disk, *, read_only: bool = False) -> list[str]:
    """Settle what a crash during a refill left (see the module's docstring); what was
    (``read_only``: would be) settled, one line each."""
    found: list[str] = []
    settled: set[Path] = set()
    for idx_copy in sorted(disk.glob(directory, f"*{INDEX_SUFFIX}{REFILL_SUFFIX}")):
        idx_path = idx_copy.with_name(idx_copy.name[: -len(REFILL_SUFFIX)])
        seg_copy = refill_path(idx_path.with_suffix(SEGMENT_SUFFIX))
        if disk.exists(seg_copy):
            settled.add(seg_copy)
            found.append(f"an unfinished refill of {idx_path.stem} (the segment is as it was)")
            if not read_only:
                log.warning("removing an unfinished refill of %s (the segment is as it was)", idx_path.stem)
                disk.unlink(idx_copy)
                disk.unlink(seg_copy)
        else:
            found.append(f"an interrupted refill of {idx_path.stem}: its data file is in, not its index")
            if not read_only:
                log.warning("finishing the refill of %s: its data file is in, now its index", idx_path.stem)
                disk.rename(idx_copy, idx_path)
    for seg_copy in sorted(disk.glob(directory, f"*{SEGMENT_SUFFIX}{REFILL_SUFFIX}")):
        if seg_copy in settled:
            continue
        found.append(f"an unfinished refill: {seg_copy.name}")
        if not read_only:
            log.warning("removing an unfinished refill: %s", seg_copy.name)
            disk.unlink(seg_copy)
    if found and not read_only:
        disk.fsync_directory(directory)
    return found


class RefillCopy:
    """The copy of one segment being written; records arrive in order from its first txid."""

    def __init__(self, seg_path: Path, idx_path: Path, first_transaction_id: int, disk: Disk) -> None:
        self._disk = disk
        self.seg_path = seg_path
        self.idx_path = idx_path
        self.first_transaction_id = first_transaction_id
        self.next_transaction_id = first_transaction_id
        self._next_offset = HEADER_SIZE_BYTES
        self._seg_file = self._idx_file = CLOSED_FILE
        # The data file's copy is renamed in: from then on only an open may finish or drop it.
        self.data_swapped = False

    @classmethod
    def begin(
        cls,
        seg_path: Path,
        idx_path: Path,
        first_transaction_id: int,
        data_header: bytes,
        index_header: bytes,
        disk: Disk,
    ) -> RefillCopy:
        """Start a copy (dropping any earlier one of this segment) with the files' headers."""
        assert len(data_header) == len(index_header) == HEADER_SIZE_BYTES
        copy = cls(seg_path, idx_path, first_transaction_id, disk)
        copy._remove_files()
        try:
            # The data file's copy first: an index copy alone means "swapped in" (see the module).
            copy._seg_file = disk.open(refill_path(seg_path), create=True, exclusive=True)
            copy._idx_file = disk.open(refill_path(idx_path), create=True, exclusive=True)
            pwrite_all(copy._seg_file, data_header, 0)
            pwrite_all(copy._idx_file, index_header, 0)
        except BaseException:
            copy.abort()
            raise
        return copy

    def append(self, records: Sequence[Record]) -> None:
        assert records and records[0].transaction_id == self.next_transaction_id
        data, index = encode_records(records, self._next_offset)
        pwrite_all(self._seg_file, data, self._next_offset)
        position = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (
            self.next_transaction_id - self.first_transaction_id
        )
        pwrite_all(self._idx_file, index, position)
        self._next_offset += len(data)
        self.next_transaction_id += len(records)

    def swap_in(self) -> None:
        """Sync the copy and rename it over the segment: data file, then index, each rename synced
        (a crash between them must find the data's rename done when the index's is)."""
        for file in (self._seg_file, self._idx_file):
            file.fsync()
        self._close()
        self._disk.rename(refill_path(self.seg_path), self.seg_path)
        self.data_swapped = True
        self._disk.fsync_directory(self.seg_path.parent)
        self._disk.rename(refill_path(self.idx_path), self.idx_path)
        self._disk.fsync_directory(self.seg_path.parent)

    def abort(self) -> None:
        """Drop the copy; the segment is untouched. Once the data file is swapped in, the index's
        copy is what the next open renames in: it is kept."""
        self._close()
        if not self.data_swapped:
            self._remove_files()

    def _close(self) -> None:
        for file in (self._seg_file, self._idx_file):
            if file is not CLOSED_FILE:
                file.close()
        self._seg_file = self._idx_file = CLOSED_FILE

    def _remove_files(self) -> None:
        # The index's copy first, for the same reason ``begin`` creates it last.
        self._disk.unlink(refill_path(self.idx_path), missing_ok=True)
        self._disk.unlink(refill_path(self.seg_path), missing_ok=True)
