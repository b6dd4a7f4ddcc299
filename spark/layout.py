"""What is on disk: the partitions of storage directories, one replica chosen per partition,
and the segment slices that cover a txid range of it (reference §1.4 for the layout).

Only file names, sizes and the control file are looked at here (cheap, on the driver); the
records themselves are read by :mod:`spark.segments` on the executors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spark.segments import SegmentSlice
from waltz_engine.common.errors import WaltzError
from waltz_engine.disk.control_reader import CONTROL_FILE_NAME, read_control_file
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import INDEX_ENTRY_SIZE_BYTES
from waltz_engine.disk.segment_reader import INDEX_SUFFIX, SEGMENT_SUFFIX, first_txid_from_name

NO_TRANSACTION = -1


class LayoutError(WaltzError):
    """A path given as a storage directory is not one."""


@dataclass(frozen=True)
class Replica:
    """One storage directory's copy of a partition."""

    partition_id: int
    directory: Path
    # (first txid, .seg path), ascending; the first need not be 0 once retention removed some.
    segments: tuple[tuple[int, Path], ...]
    # The highest txid the index files list (NO_TRANSACTION for an empty partition).
    max_txid: int
    # The control file's low-water mark: the last txid this node knows to be committed.
    low_water_mark: int

    @property
    def first_txid(self) -> int:
        return self.segments[0][0] if self.segments else 0


def _index_entries(segment: Path) -> int:
    try:
        size = os.stat(segment.with_suffix(INDEX_SUFFIX)).st_size
    except FileNotFoundError:
        return 0
    return max(0, (size - HEADER_SIZE_BYTES) // INDEX_ENTRY_SIZE_BYTES)


def _replica(directory: Path, partition_id: int, low_water_mark: int) -> Replica | None:
    partition_dir = directory / str(partition_id)
    if not partition_dir.is_dir():
        return None
    found = ((first_txid_from_name(p), p) for p in partition_dir.glob("*" + SEGMENT_SUFFIX))
    segments = tuple(sorted((first, p) for first, p in found if first is not None))
    if not segments:
        return None
    last_first, last_path = segments[-1]
    return Replica(
        partition_id, directory, segments, last_first + _index_entries(last_path) - 1, low_water_mark
    )


def discover(directories: Iterable[Path]) -> dict[int, list[Replica]]:
    """Every partition found in ``directories`` and the replicas that hold it."""
    replicas: dict[int, list[Replica]] = {}
    for directory in directories:
        if not (directory / CONTROL_FILE_NAME).is_file():
            raise LayoutError(f"{directory}: not a storage directory (it has no {CONTROL_FILE_NAME})")
        control = read_control_file(directory)
        for view in control.partitions:
            current = view.current
            low_water_mark = current.low_water_mark if current is not None else NO_TRANSACTION
            replica = _replica(directory, view.partition_id, low_water_mark)
            if replica is not None:
                replicas.setdefault(view.partition_id, []).append(replica)
    return replicas


def choose_replica(replicas: Sequence[Replica]) -> Replica:
    """The replica with the most of the log: the highest max txid, then the earliest first txid
    (a lagging replica may miss committed records; one trimmed later has more history); ties go
    to the directory given first, so a plan is stable."""
    return min(replicas, key=lambda r: (-r.max_txid, r.first_txid))


def slices(replica: Replica, from_txid: int, to_txid: int) -> list[SegmentSlice]:
    """The parts of ``replica``'s segments that hold txids ``from_txid..to_txid`` (inclusive)."""
    result: list[SegmentSlice] = []
    bounds = [first for first, _ in replica.segments[1:]] + [replica.max_txid + 1]
    for (first, path), next_first in zip(replica.segments, bounds, strict=True):
        low, high = max(first, from_txid), min(next_first - 1, to_txid)
        if low <= high:
            result.append(SegmentSlice(replica.partition_id, str(path), first, low, high))
    return result
