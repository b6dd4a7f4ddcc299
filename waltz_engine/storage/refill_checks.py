"""The checks a refill (``Partition.refill``, see ``refill.py``) passes before it touches a
file, and the headers its copy is written with."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.storage.file_system import Disk
from waltz_engine.storage.partition_files import file_head
from waltz_engine.storage.segment import Segment
from waltz_engine.storage.segment_finder import find_segment


def refill_target(partition_id: int, segments: Sequence[Segment], records: Sequence[Record]) -> Segment:
    """The one segment ``records`` refill: they come in order, stay within it, and each is whole
    (its data checksum too), or nothing is replaced."""
    if not records:
        raise StorageError(f"partition {partition_id}: a refill without records")
    first = records[0].transaction_id
    if any(r.transaction_id != first + i for i, r in enumerate(records)):
        raise StorageError("transaction out of order")
    segment = find_segment(segments, first)
    if segment is None:
        raise StorageError(f"partition {partition_id} holds no transaction {first} to refill")
    last = records[-1].transaction_id
    if last > segment.max_transaction_id:
        raise StorageError(
            f"partition {partition_id}: a refill stays within one segment; transaction {last} "
            f"is past segment {segment.first_transaction_id}-{segment.max_transaction_id}"
        )
    for record in records:
        # Whole means what it means everywhere: the data checksum too (the CRC is ours).
        if crc32(record.data) != record.checksum:
            raise StorageError(
                f"partition {partition_id}: transaction {record.transaction_id} sent to refill "
                "fails its data checksum; nothing was replaced"
            )
    return segment


def copy_headers(disk: Disk, segment: Segment, clock_ms: Callable[[], int]) -> tuple[bytes, bytes]:
    """The headers the segment was written with (byte for byte), or new ones if they are damaged."""
    if not segment.header_damaged:
        return file_head(disk, segment.seg_path), file_head(disk, segment.idx_path)
    fresh = segment.header._replace(creation_time_ms=clock_ms()).to_bytes()
    return fresh, fresh
