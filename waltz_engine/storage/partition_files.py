"""The files of a partition directory as a crash can leave them: what an open cleans up, and
a file's header bytes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from waltz_engine.common.fileio import pread_upto
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.storage.constants import INDEX_SUFFIX, SEGMENT_SUFFIX
from waltz_engine.storage.file_system import Disk, OsDisk
from waltz_engine.storage.refill import clean_interrupted_refills
from waltz_engine.storage.segment_files import first_transaction_id_of

log = logging.getLogger(__name__)


def local_usage(directory: Path, disk: Disk | None = None) -> tuple[int, int]:
    """(segments, bytes of their data and index files) in a partition directory, read without
    the partition's lock (a gauge must not wait for an fsync); through ``disk`` when it is not
    the machine's (the simulator's)."""
    segments = size_bytes = 0
    if disk is not None and not isinstance(disk, OsDisk):
        for path in disk.glob(directory, "*"):
            if path.name.endswith((SEGMENT_SUFFIX, INDEX_SUFFIX)):
                segments += path.name.endswith(SEGMENT_SUFFIX)
                size_bytes += disk.file_size_bytes(path)
        return segments, size_bytes
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith((SEGMENT_SUFFIX, INDEX_SUFFIX)):
                segments += entry.name.endswith(SEGMENT_SUFFIX)
                size_bytes += entry.stat().st_size
    return segments, size_bytes


def file_head(disk: Disk, path: Path) -> bytes:
    file = disk.open(path)
    try:
        return pread_upto(file, HEADER_SIZE_BYTES, 0)
    finally:
        file.close()


def clean_interrupted_files(directory: Path, disk: Disk, *, read_only: bool = False) -> list[str]:
    """Remove what a crash can leave half made, which the original would refuse to open; what
    was (``read_only``: would be) removed, one line each.

    * an ``.idx`` without its ``.seg``: a truncate died between deleting the two files, or a
      rollover died between creating them; no data was ever stored under that name;
    * the newest segment with a ``.seg`` shorter than a header: a rollover died while
      creating it (records are written only after both headers are synced).
    """
    found: list[str] = []
    for idx_path in sorted(disk.glob(directory, "*" + INDEX_SUFFIX)):
        if not disk.exists(idx_path.with_suffix(SEGMENT_SUFFIX)):
            found.append(f"index file without its data file (interrupted): {idx_path.name}")
            if not read_only:
                log.warning("removing index file without data file (interrupted): %s", idx_path)
                disk.unlink(idx_path)
    seg_paths = sorted(disk.glob(directory, "*" + SEGMENT_SUFFIX))
    if seg_paths and disk.file_size_bytes(seg_paths[-1]) < HEADER_SIZE_BYTES:
        found.append(f"segment whose creation was interrupted: {seg_paths[-1].name}")
        if not read_only:
            log.warning("removing segment whose creation was interrupted: %s", seg_paths[-1])
            disk.unlink(seg_paths[-1].with_suffix(INDEX_SUFFIX), missing_ok=True)
            disk.unlink(seg_paths[-1])
    return found + clean_interrupted_refills(directory, disk, read_only=read_only)


def segment_paths_read_only(directory: Path, disk: Disk) -> tuple[list[Path], list[str]]:
    """The segment files a read-only open checks, in txid order, and what an open for writing
    would clean, create or refuse first (nothing to check when the list is empty)."""
    if not disk.exists(directory):
        return [], [f"partition directory {directory.name} is missing"]
    findings = clean_interrupted_files(directory, disk, read_only=True)
    seg_paths = sorted(disk.glob(directory, "*" + SEGMENT_SUFFIX), key=first_transaction_id_of)
    if seg_paths and disk.file_size_bytes(seg_paths[-1]) < HEADER_SIZE_BYTES:
        seg_paths.pop()  # its creation was interrupted (listed by the cleaning above)
    if not seg_paths:
        return [], [*findings, "no segment files (an open for writing creates segment 0)"]
    lone = [p.name for p in seg_paths if not disk.exists(p.with_suffix(INDEX_SUFFIX))]
    if lone:
        return [], [*findings, f"data file without its index file: {', '.join(lone)}"]
    return seg_paths, findings
