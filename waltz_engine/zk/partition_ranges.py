"""Partition lists as comma-separated ids and ranges: ``0-6,7,10-16`` (``TL/CliUtils.parseIntRanges``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from waltz_engine.common.errors import WaltzError
from waltz_engine.zk.java_io import INT32_MAX

# A typo like 0-2000000000 must not allocate billions of ints before the range check.
MAX_PARTITIONS_PER_REQUEST = 1 << 16

_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


class PartitionRangeError(WaltzError):
    """Partition range text that does not parse."""


def parse_partition_ranges(text: str) -> list[int]:
    """Sorted, de-duplicated partition ids; unlike the original, reversed ranges and blanks are errors."""
    if not text.strip():
        raise PartitionRangeError("partition list is empty; expected ids and ranges like 0-6,7,10-16")
    partitions: set[int] = set()
    for part in text.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise PartitionRangeError(
                f"'{part.strip()}' in '{text}' is not a partition id or a range like 0-6"
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high > INT32_MAX:
            raise PartitionRangeError(f"partition {high} in '{text}' is too large")
        if low > high:
            raise PartitionRangeError(f"range '{part.strip()}' in '{text}' goes backwards")
        if len(partitions) + (high - low + 1) > MAX_PARTITIONS_PER_REQUEST:
            raise PartitionRangeError(f"'{text}' names more than {MAX_PARTITIONS_PER_REQUEST} partitions")
        partitions.update(range(low, high + 1))
    return sorted(partitions)


def format_partition_ranges(partitions: Iterable[int]) -> str:
    """The inverse, compacted: [0, 1, 2, 3, 7] → ``0-3,7``."""
    parts: list[str] = []
    ordered = sorted(set(partitions))
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        parts.append(str(ordered[index]) if end == index else f"{ordered[index]}-{ordered[end]}")
        index = end + 1
    return ",".join(parts)


def not_in_cluster(partitions: Iterable[int], num_partitions: int) -> str:
    """How every command words partitions the cluster does not have (the original's "does not
    belong to the cluster"), naming the ones it has."""
    outside = format_partition_ranges(sorted(set(partitions)))
    has = f"partitions 0-{num_partitions - 1}" if num_partitions > 0 else "no partitions"
    which = f"Partition {outside} does" if outside.isdigit() else f"Partitions {outside} do"
    return f"{which} not belong to the cluster (it has {has})"
