"""``/health``'s integrity check (issue 13, item 2): a node holding a damaged segment serves what
is good but is not healthy until the segment is refilled from a healthy replica."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from waltz_engine.storage.partition import Partition

INTEGRITY_CHECK_NAME = "storage-integrity-check"
REFILL_ADVICE = "refill from a healthy replica: waltz storage recover-partition"


class _Serving(Protocol):
    @property
    def partition(self) -> Partition | None: ...


def integrity_health(workers: Mapping[int, _Serving]) -> tuple[bool, dict[str, Any]]:
    """(healthy, details): every damaged segment per partition, and what to do about it."""
    damaged: dict[str, list[str]] = {}
    for partition_id, worker in sorted(workers.items()):
        partition = worker.partition
        report = partition.damage_report() if partition is not None else []
        if report:
            damaged[str(partition_id)] = [d.describe() for d in report]
    if not damaged:
        return True, {"damaged": "none"}
    return False, {"damaged": damaged, "fix": REFILL_ADVICE}
