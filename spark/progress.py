"""The progress of a running export: rows and bytes per partition against the rows to do.

The rows to do are known before Spark starts (the plan fixes each partition's txid range). The
rows done are counted by the export tasks, per batch, into a Spark accumulator of
:class:`CountsParam`: no extra I/O and one small dict per task. Spark merges an accumulator on the
driver when a task ends, so what the driver sees moves task by task (a task holds at most
``export_task.TASK_MAX_ROWS`` rows). A driver thread polls it with the status tracker's task
counts and hands :func:`snapshot` to the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.accumulators import AccumulatorParam

# partition id -> (rows, bytes) counted so far.
PartitionCounts = dict[int, tuple[int, int]]
# What an export task reports for each batch it writes.
CountBatch = Callable[[PartitionCounts], None]


class CountsParam(AccumulatorParam[PartitionCounts]):
    """Sums :data:`PartitionCounts` per partition. The merge returns a new dict (never changes one
    in place), so the driver thread reading the value never sees one half merged."""

    def zero(self, value: PartitionCounts) -> PartitionCounts:
        return {}

    def addInPlace(self, value1: PartitionCounts, value2: PartitionCounts) -> PartitionCounts:
        merged = dict(value1)
        for partition, (rows, size) in value2.items():
            old_rows, old_size = merged.get(partition, (0, 0))
            merged[partition] = (old_rows + rows, old_size + size)
        return merged


@dataclass(frozen=True)
class PartitionProgress:
    partition: int
    rows: int
    rows_total: int
    bytes: int


@dataclass(frozen=True)
class ExportProgress:
    partitions: tuple[PartitionProgress, ...]
    tasks_done: int
    tasks_total: int

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def rows_total(self) -> int:
        return sum(p.rows_total for p in self.partitions)


ProgressCallback = Callable[[ExportProgress], None]


def snapshot(
    rows_to_do: Mapping[int, int], counts: PartitionCounts, tasks_done: int, tasks_total: int
) -> ExportProgress:
    """Every planned partition, in id order, with its rows and bytes done. Rows are capped at the
    rows to do: a stage Spark runs again may merge a task's counts twice."""
    partitions = []
    for partition in sorted(rows_to_do):
        rows, size = counts.get(partition, (0, 0))
        total = rows_to_do[partition]
        partitions.append(PartitionProgress(partition, min(rows, total), total, size))
    return ExportProgress(tuple(partitions), tasks_done, tasks_total)
