"""Names, defaults and limits of a storage directory (reference §1.1, §1.4, §0.4)."""

from __future__ import annotations

from pathlib import Path

from waltz_engine.common import clock

CONTROL_FILE_NAME = "waltz-storage.ctl"
SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
# Segment files are named by their first transaction id, zero padded (Java "%019d.%s").
SEGMENT_NAME_DIGITS = 19

# `storage.segment.size.threshold`: a segment rolls over once it is larger than this.
DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES = 1_000_000_000
# `storage.segment.cache.capacity`: sealed segments kept open per partition.
DEFAULT_SEGMENT_CACHE_CAPACITY = 5

# The control file lock covers the header only, as the original's `tryLock(0, 128)`.
CONTROL_LOCK_START_BYTES = 0
CONTROL_LOCK_SIZE_BYTES = 128


def segment_paths(directory: Path, first_transaction_id: int) -> tuple[Path, Path]:
    """The ``.seg`` and ``.idx`` paths of the segment starting at ``first_transaction_id``."""
    assert first_transaction_id >= 0
    stem = f"{first_transaction_id:0{SEGMENT_NAME_DIGITS}d}"
    return directory / (stem + SEGMENT_SUFFIX), directory / (stem + INDEX_SUFFIX)


def now_ms() -> int:
    """Wall-clock milliseconds, as Java's ``System.currentTimeMillis()`` in file headers."""
    return clock.wall_ms()
