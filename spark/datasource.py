"""The ``waltz`` PySpark data source: ``spark.read.format("waltz")`` and ``readStream``.

Batch: one Spark partition per segment slice (see :mod:`spark.plan` for the options), read
only up to each partition's committed bound, one replica per partition. Stream: offsets are
``{"<partition>": last txid delivered}`` (JSON); each micro-batch reads the txids committed
since the previous one, at most ``max_rows_per_trigger`` of them when that is set (shared
out evenly over the partitions that have new ones). Records never change once committed, so
a micro-batch replayed from a checkpoint reads exactly the same rows, which makes a file sink
with a checkpoint exactly once. ``trigger(availableNow=True)`` reads what was committed when
the query started, in limited micro-batches, then stops.

Register with :func:`register` (``spark.dataSource.register(WaltzDataSource)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark.layout import NO_TRANSACTION, choose_replica, slices
from spark.plan import ReadOptions, found_replicas, plan
from spark.schema import SPARK_SCHEMA
from spark.segments import SegmentSlice, read_slice

DATA_SOURCE_NAME = "waltz"

StreamOffset = dict[str, int]


class SlicePartition(InputPartition):
    """A Spark input partition: one segment slice (picklable, as Spark requires)."""

    def __init__(self, part: SegmentSlice) -> None:
        super().__init__(part)
        self.part = part


def _input_partitions(parts: Sequence[SegmentSlice]) -> list[InputPartition]:
    return [SlicePartition(p) for p in parts]


def _read(partition: InputPartition, on_corrupt: str) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, SlicePartition)
    yield from read_slice(partition.part, on_corrupt)


class WaltzBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return _input_partitions([s for p in plan(self.options) for s in p.slices])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options.on_corrupt)


def admit(start: StreamOffset, available: StreamOffset, max_rows: int) -> StreamOffset:
    """``start`` advanced towards ``available`` by at most ``max_rows`` transactions in all.

    Shares are even; a partition with fewer new transactions than its share leaves the rest
    to the others (so a busy partition cannot starve a quiet one, nor the reverse). At least
    one transaction is admitted whenever any is new, so a stream always makes progress."""
    assert max_rows >= 1
    new = {k: last - start.get(k, NO_TRANSACTION) for k, last in available.items()}
    waiting = sorted((k for k, n in new.items() if n > 0), key=lambda k: (new[k], int(k)))
    latest = dict(start)
    remaining = max_rows
    for position, key in enumerate(waiting):
        share = max(1, remaining // (len(waiting) - position)) if remaining > 0 else 0
        taken = min(new[key], share)
        latest[key] = start.get(key, NO_TRANSACTION) + taken
        remaining -= taken
    assert remaining >= 0
    return latest


class WaltzStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        # Under trigger(availableNow=True): what was committed when the query started.
        self.target: StreamOffset | None = None

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        if self.options.max_rows_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self.target = self._available({})

    def initialOffset(self) -> StreamOffset:  # noqa: N802 - Spark's name
        start = self.options.from_txid
        return {
            str(p): self.options.from_txids.get(p, start) - 1 for p in sorted(found_replicas(self.options))
        }

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:  # noqa: N802
        available = self._available(start)
        if self.target is not None:
            # Nothing committed after the query started; a partition new since then waits.
            target = self.target
            available = {k: min(v, target.get(k, start.get(k, NO_TRANSACTION))) for k, v in available.items()}
        if isinstance(limit, ReadMaxRows):
            return admit(start, available, limit.max_rows)
        if isinstance(limit, ReadMinRows):
            new = sum(v - start.get(k, NO_TRANSACTION) for k, v in available.items())
            return available if new >= limit.min_rows else dict(start)
        return available

    def _available(self, start: StreamOffset) -> StreamOffset:
        """Every committed transaction: the committed bound and the chosen replica's log both
        cap it, and an offset never goes backwards."""
        latest = dict(start)
        for partition in plan(self.options):
            key = str(partition.partition_id)
            latest[key] = max(latest.get(key, NO_TRANSACTION), partition.to_txid)
        return latest

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        replicas = found_replicas(self.options)
        parts: list[SegmentSlice] = []
        for key, last in sorted(end.items(), key=lambda item: int(item[0])):
            partition_id, first = int(key), start.get(key, NO_TRANSACTION) + 1
            if last >= first and partition_id in replicas:
                parts += slices(choose_replica(replicas[partition_id]), first, last)
        return _input_partitions(parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options.on_corrupt)

    def commit(self, end: StreamOffset) -> None:
        # Nothing to release: the log is read in place and never consumed.
        return None


class WaltzDataSource(DataSource):
    """``spark.read.format("waltz").option("path", "/data/storage-0").load()``."""

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def _options(self) -> ReadOptions:
        options: Mapping[str, str] = self.options
        return ReadOptions.parse(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return WaltzBatchReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        options = self._options()
        return WaltzStreamReader(options)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(WaltzDataSource)


__all__ = ["DATA_SOURCE_NAME", "WaltzDataSource", "register"]
