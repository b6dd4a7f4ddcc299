"""The ``waltz`` PySpark data source: ``spark.read.format("waltz")`` and ``readStream``.

Batch: one Spark partition per segment slice (see :mod:`spark.plan` for the options), read
only up to each partition's committed bound, one replica per partition. Stream: offsets are
``{"<partition>": last txid delivered}`` (JSON); each micro-batch reads the txids committed
since the previous one. Records never change once committed, so a micro-batch replayed from
a checkpoint reads exactly the same rows, which makes a file sink with a checkpoint exactly
once.

Register with :func:`register` (``spark.dataSource.register(WaltzDataSource)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
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


class WaltzStreamReader(DataSourceStreamReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def initialOffset(self) -> StreamOffset:  # noqa: N802 - Spark's name
        start = self.options.from_txid
        return {
            str(p): self.options.from_txids.get(p, start) - 1 for p in sorted(found_replicas(self.options))
        }

    def latestOffset(self, start: StreamOffset, limit: object) -> StreamOffset:  # noqa: N802
        # Every available transaction (the default ReadAllAvailable); committed bound and the
        # chosen replica's log both cap it, and an offset never goes backwards.
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
