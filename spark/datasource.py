"""The ``waltz`` PySpark data source: ``spark.read.format("waltz")`` and ``readStream``.

Batch: one Spark partition per segment slice (see :mod:`spark.plan` for the options), read
only up to each partition's committed bound, one replica per partition. Stream: offsets are
``{"<partition>": last txid delivered}`` (JSON); each micro-batch reads the txids committed
since the previous one, at most ``max_rows_per_trigger`` of them when that is set (shared
out evenly over the partitions that have new ones). Records never change once committed, so
a micro-batch replayed from a checkpoint reads exactly the same rows, which makes a file sink
with a checkpoint exactly once. ``trigger(availableNow=True)`` reads what was committed when
the query started, in limited micro-batches, then stops.

Filters on ``partition`` and ``transaction_id`` (equality, IN, ranges) are pushed down: only
the partitions and txids they select are read.

Register with :func:`register` (``spark.dataSource.register(WaltzDataSource)``; it also turns on
``spark.sql.python.filterPushdown.enabled``, which Python sources need for pushdown).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark.layout import NO_TRANSACTION
from spark.network import read_part
from spark.plan import MAX_TXID, PartitionFilter, ReadOptions, Slice, partition_ids, plan
from spark.schema import COLUMN_PARTITION, COLUMN_TRANSACTION_ID, SPARK_SCHEMA

DATA_SOURCE_NAME = "waltz"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

StreamOffset = dict[str, int]


class SlicePartition(InputPartition):
    """A Spark input partition: one slice (picklable, as Spark requires)."""

    def __init__(self, part: Slice) -> None:
        super().__init__(part)
        self.part = part


# Spark's setting that reports a Python worker's error as its "module.Class: message" line alone.
HIDE_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


def _input_partitions(parts: Sequence[Slice]) -> list[InputPartition]:
    return [SlicePartition(p) for p in parts]


def _read(partition: InputPartition, on_corrupt: str) -> Iterator[pa.RecordBatch]:
    # Spark plans one InputPartition(None) when a plan has none: an empty range reads nothing.
    if isinstance(partition, SlicePartition):
        yield from read_part(partition.part, on_corrupt)


def _int_value(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_range(f: Filter, value: int) -> tuple[int, int] | None:
    """The inclusive range a comparison with ``value`` selects; None for other filters."""
    if isinstance(f, EqualTo | EqualNullSafe):
        return value, value
    if isinstance(f, GreaterThan):
        return value + 1, MAX_TXID
    if isinstance(f, GreaterThanOrEqual):
        return value, MAX_TXID
    if isinstance(f, LessThan):
        return NO_TRANSACTION + 1, value - 1
    if isinstance(f, LessThanOrEqual):
        return NO_TRANSACTION + 1, value
    return None


def push_filters(options: ReadOptions, filters: Iterable[Filter]) -> tuple[ReadOptions, list[Filter]]:
    """``options`` narrowed by the filters on ``partition`` and ``transaction_id`` that it applies
    exactly, and the filters Spark must still evaluate (the others, and IN on txids, which is
    read as the range from its least to its greatest value)."""
    kept: set[int] | None = None  # partitions an equality or IN allows
    ranges = {COLUMN_PARTITION: (0, MAX_TXID), COLUMN_TRANSACTION_ID: (0, MAX_TXID)}
    left: list[Filter] = []
    for f in filters:
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        column = attribute[0] if len(attribute) == 1 else None
        if column not in ranges:
            left.append(f)
            continue
        if isinstance(f, In):
            values = [_int_value(v) for v in f.value]
            ints = {v for v in values if v is not None}
            if len(ints) != len(set(values)) or not ints:
                left.append(f)
            elif column == COLUMN_PARTITION:
                kept = ints if kept is None else kept & ints
            else:
                low, high = ranges[column]
                ranges[column] = max(low, min(ints)), min(high, max(ints))
                left.append(f)
            continue
        value = _int_value(getattr(f, "value", None))
        selected = _as_range(f, value) if value is not None else None
        if selected is None:
            left.append(f)
            continue
        low, high = ranges[column]
        ranges[column] = max(low, selected[0]), min(high, selected[1])
    narrowed = options
    low, high = ranges[COLUMN_PARTITION]
    if kept is not None or (low, high) != (0, MAX_TXID):
        narrowed = replace(
            narrowed, partition_filter=PartitionFilter(low, high, kept).within(options.partition_filter)
        )
    low, high = ranges[COLUMN_TRANSACTION_ID]
    if (low, high) != (0, MAX_TXID):
        narrowed = replace(
            narrowed,
            from_txid=max(narrowed.from_txid, low),
            from_txids={p: max(t, low) for p, t in narrowed.from_txids.items()},
            to_txid=high if narrowed.to_txid is None else min(narrowed.to_txid, high),
            to_txids={p: min(t, high) for p, t in narrowed.to_txids.items()},
        )
    return narrowed, left


class WaltzBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        self.options, left = push_filters(self.options, filters)
        return left

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
        return {str(p): self.options.from_txids.get(p, start) - 1 for p in partition_ids(self.options)}

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
        # The end offsets were committed when latestOffset found them: they are the bounds, which
        # plan caps at the committed mark of now (a checkpoint's may predate a roll-back).
        wanted = {int(k): last for k, last in end.items() if last >= start.get(k, NO_TRANSACTION) + 1}
        if not wanted:
            return []
        options = replace(
            self.options,
            partitions=tuple(sorted(wanted)),
            from_txids={p: start.get(str(p), NO_TRANSACTION) + 1 for p in wanted},
            to_txids=wanted,
        )
        return _input_partitions([s for p in plan(options, bounds=wanted) for s in p.slices])

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
    """Register the ``waltz`` source; turn on filter pushdown and, unless the session sets it,
    hide Python workers' tracebacks, so that an error's first line ends with the source's own
    message (``spark.plan.OptionsError: unknown option(s) ...``) instead of a traceback whose
    last line it is."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    if spark.conf.get(HIDE_TRACEBACK_CONF, None) is None:
        spark.conf.set(HIDE_TRACEBACK_CONF, "true")
    spark.dataSource.register(WaltzDataSource)


__all__ = ["DATA_SOURCE_NAME", "WaltzDataSource", "register"]
