"""The executor side of ``waltz spark export``: one task parses one slice of a segment and writes
its records to one Parquet file in the run's staging directory, with pyarrow.

Why not ``DataFrame.write.parquet`` over the ``waltz`` data source: that path ships every
record from the Python worker to the JVM (Arrow IPC), turns the columns into rows there and
encodes them again; on 2 cores it ran at 0.7 M rows/s warm and 0.17 M rows/s in a fresh
process, against 1.5 M rows/s for the parser alone (docs/benchmarks.md). Writing where the
batches are made keeps them columnar end to end; Spark still schedules the tasks, retries
them and runs them on a standalone cluster's executors.

A file is named for its txid range, so a retried (or speculative) attempt of a task produces
the same file, put in place by an atomic rename, and no two runs into one output collide:
their ranges never overlap. Each file is fsynced before the task reports it: the driver's
commit point (``commit.json``) may only name durable files.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark.network import read_part
from spark.plan import Slice
from spark.progress import CountBatch
from spark.schema import COLUMN_DATA, COLUMN_DECODED, COLUMN_PARTITION, COLUMN_TRANSACTION_ID
from spark.tier import SourceCounts
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.fileio import fsync_file

PARQUET_SUFFIX = ".parquet"
# What a record the --decoder cannot read does (--on-decode-error): end the export naming it,
# leave the record out, or keep it with a null "decoded" (its bytes are in "data" as ever).
ON_DECODE_ERROR_FAIL = "fail"
ON_DECODE_ERROR_SKIP = "skip"
ON_DECODE_ERROR_RAW = "raw"
ON_DECODE_ERROR_CHOICES = (ON_DECODE_ERROR_FAIL, ON_DECODE_ERROR_SKIP, ON_DECODE_ERROR_RAW)
# Rows per task: a file of at most this many rows, and the unit Spark balances over cores.
TASK_MAX_ROWS = 1_000_000
# A slice is not split below this many rows only to occupy an idle core (tiny files cost more
# to list and open than the parallelism gains).
TASK_MIN_ROWS = 100_000
# Measured on 1 M rows x 100 B (docs/benchmarks.md): dictionaries (payloads are mostly
# distinct; the small int columns compress as well without) and min/max statistics of the
# binary columns cost 2.5x the write time. Statistics stay on the txid, for range filters.
PARQUET_WRITE_OPTIONS: dict[str, object] = {
    "compression": "snappy",
    "use_dictionary": False,
    "write_statistics": [COLUMN_TRANSACTION_ID],
}


@dataclass(frozen=True)
class ExportTask:
    """What one Spark task does (pickled to the executor)."""

    part: Slice
    staging: str  # the run's staging directory (shared by driver and executors)
    on_corrupt: str
    decoder: str | None = None  # module:function adding the "decoded" column
    decoder_path: str | None = None  # where the driver found the decoder's module
    on_decode_error: str = ON_DECODE_ERROR_FAIL


class DecoderFailedError(WaltzError):
    """The --decoder raised on a record and --on-decode-error is fail (its name ends in Error:
    the driver finds it in Spark's report of the failed task)."""


@dataclass(frozen=True)
class TaskResult:
    partition_id: int
    rows: int
    file: str | None  # relative to the staging directory; None when no row was left
    tier_rows: int = 0  # rows read from the tier's objects (spark.tier)
    tier_fallbacks: int = 0  # tier slices whose rest was read over the network


def file_name(part: Slice) -> str:
    """``partition=N/part-<from txid>-<to txid>.parquet``, hive-style like Spark's own writer."""
    name = f"part-{part.from_txid:019d}-{part.to_txid:019d}{PARQUET_SUFFIX}"
    return f"{COLUMN_PARTITION}={part.partition_id}/{name}"


def split(parts: Sequence[Slice], parallelism: int) -> list[Slice]:
    """``parts`` cut into tasks of at most :data:`TASK_MAX_ROWS` rows, and into at least
    ``parallelism`` tasks when that leaves each at least :data:`TASK_MIN_ROWS` rows."""
    assert parallelism >= 1
    total = sum(p.count for p in parts)
    target = max(TASK_MIN_ROWS, min(TASK_MAX_ROWS, -(-total // parallelism)))
    tasks: list[Slice] = []
    for part in parts:
        if part.count == 0:
            continue
        pieces = -(-part.count // target)
        size = -(-part.count // pieces)
        for start in range(part.from_txid, part.to_txid + 1, size):
            tasks.append(replace(part, from_txid=start, to_txid=min(start + size - 1, part.to_txid)))
    assert sum(t.count for t in tasks) == total
    return tasks


def run_task(task: ExportTask, count_batch: CountBatch | None = None) -> TaskResult:
    """Write the task's records (partition column left to the folder name) to its file; each
    batch written is counted with ``count_batch`` (rows, in-memory bytes) when given."""
    target = Path(task.staging) / file_name(task.part)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    rows = 0
    sources = SourceCounts()
    writer: pq.ParquetWriter | None = None
    try:
        for batch in _output_batches(task, sources):
            if writer is None:
                writer = pq.ParquetWriter(temporary, batch.schema, **PARQUET_WRITE_OPTIONS)
            writer.write_batch(batch)
            rows += batch.num_rows
            if count_batch is not None:
                count_batch({task.part.partition_id: (batch.num_rows, batch.nbytes)})
        if writer is None:
            return TaskResult(task.part.partition_id, 0, None, sources.tier_rows, sources.fallbacks)
        writer.close()
        writer = None
        fsync_file(temporary)
        os.replace(temporary, target)
    finally:
        if writer is not None:
            writer.close()
        temporary.unlink(missing_ok=True)
    return TaskResult(
        task.part.partition_id, rows, file_name(task.part), sources.tier_rows, sources.fallbacks
    )


def _output_batches(task: ExportTask, sources: SourceCounts) -> Iterator[pa.RecordBatch]:
    read = read_part(task.part, task.on_corrupt, sources)
    batches = (b.drop_columns([COLUMN_PARTITION]) for b in read)
    if task.decoder is None:
        yield from batches
        return
    if task.decoder_path is not None and task.decoder_path not in sys.path:
        sys.path.append(task.decoder_path)
    from waltz_engine.common.decoder import load_decoder, try_decode

    decode = load_decoder(task.decoder)
    for batch in batches:
        values: list[str | None] = []
        keep: list[bool] = []
        txids = batch.column(COLUMN_TRANSACTION_ID).to_pylist()
        for txid, data in zip(txids, batch.column(COLUMN_DATA).to_pylist(), strict=True):
            decoded, error = try_decode(decode, data)
            if error is not None and task.on_decode_error == ON_DECODE_ERROR_FAIL:
                raise DecoderFailedError(
                    f"--decoder {task.decoder} cannot read partition {task.part.partition_id} "
                    f"transaction {txid} ({error}); --on-decode-error skip or raw exports the rest"
                )
            keep.append(error is None or task.on_decode_error == ON_DECODE_ERROR_RAW)
            values.append(None if error is not None else _as_text(decoded))
        decoded_batch = batch.append_column(COLUMN_DECODED, pa.array(values, type=pa.string()))
        yield decoded_batch if all(keep) else decoded_batch.filter(pa.array(keep))


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
