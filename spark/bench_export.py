"""Export throughput: ``waltz spark export`` beside the segment parser alone (one process, no Spark).

Generates (once; reused when ``--dir`` already holds it) a storage directory with the storage
engine itself — ``--rows`` transactions of ``--data-bytes`` each over ``--partitions``
partitions, appended in large batches, all committed (the control file's low-water marks) —
then measures:

* ``parse``: :func:`spark.segments.read_slice` over every slice of the plan, building the same
  Arrow batches Spark receives, in this process;
* ``export``: ``waltz spark export --master MASTER`` into a fresh output; its rows/s is the
  CLI's own summary (planning, the Spark job, the commit), its JVM start is reported apart.

    waltz bench export --rows 2000000 --dir /tmp/waltz-bench-export --warm-runs 3
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spark.plan import MAX_TXID, OPTION_PATHS, OPTION_TO_TXID, ReadOptions, Slice, plan
from spark.segments import SegmentSlice, read_slice
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage import StorageManager
from waltz_engine.storage.constants import CONTROL_FILE_NAME

DEFAULT_ROWS = 2_000_000
DEFAULT_PARTITIONS = 4
DEFAULT_DATA_BYTES = 100
DEFAULT_MASTER = "local[2]"
# Records per Partition.append: large batches, as a busy storage node writes them.
APPEND_BATCH_RECORDS = 50_000
BENCH_KEY = uuid.UUID("5b1e7a0c-3f64-4c2d-8e91-0d7f2a6b9c14")
BENCH_CLIENT_ID = 1
BENCH_GENERATION = 1
BENCH_SESSION_ID = 1
STORAGE_DIR_NAME = "storage"
EXPORT_DIR_NAME = "export"
WARM_EXPORT_DIR_PREFIX = "export-warm-"
TXID_PREFIX_BYTES = 8  # each record's data starts with its txid, so no two are alike


def _read_options(storage: Path) -> dict[str, str]:
    """Everything the generated directory holds: all of it is committed (its writer says so)."""
    return {OPTION_PATHS: str(storage), OPTION_TO_TXID: str(MAX_TXID)}


def _local(part: Slice) -> SegmentSlice:
    assert isinstance(part, SegmentSlice)
    return part


def rows_of(partition_id: int, rows: int, partitions: int) -> int:
    return rows // partitions + (1 if partition_id < rows % partitions else 0)


def _records(partition_id: int, first: int, count: int, filler: bytes) -> list[Record]:
    records = []
    for txid in range(first, first + count):
        data = txid.to_bytes(TXID_PREFIX_BYTES, "big") + filler
        records.append(
            Record(txid, ReqId(BENCH_CLIENT_ID, BENCH_GENERATION, partition_id, txid), 0, data, crc32(data))
        )
    return records


def generate(storage: Path, rows: int, partitions: int, data_bytes: int) -> float:
    """Write the log; returns seconds taken (0 when an identical one is already there)."""
    if (storage / CONTROL_FILE_NAME).is_file():
        with StorageManager(storage, BENCH_KEY, partitions) as manager:
            committed = [manager.partition(p).info.current.local_low_water_mark for p in range(partitions)]
        if committed == [rows_of(p, rows, partitions) - 1 for p in range(partitions)]:
            return 0.0
        shutil.rmtree(storage)
    storage.mkdir(parents=True, exist_ok=True)
    filler = bytes(i % 251 for i in range(max(0, data_bytes - TXID_PREFIX_BYTES)))
    started = time.perf_counter()
    with StorageManager(storage, BENCH_KEY, partitions) as manager:
        manager.set_partition_assignment(list(range(partitions)), True)
        for partition_id in range(partitions):
            partition = manager.partition(partition_id)
            total = rows_of(partition_id, rows, partitions)
            for first in range(0, total, APPEND_BATCH_RECORDS):
                partition.append(
                    _records(partition_id, first, min(APPEND_BATCH_RECORDS, total - first), filler)
                )
            # A session that starts after them: every record is committed (the export's bound).
            partition.set_low_water_mark(BENCH_SESSION_ID, total - 1)
    return time.perf_counter() - started


def parse_all(storage: Path) -> tuple[int, float]:
    """(rows, seconds) of parsing every committed record into Arrow batches in this process."""
    parts = [s for p in plan(ReadOptions.parse(_read_options(storage))) for s in p.slices]
    # Warm-up, not timed: the first batch pays one-time imports (pyarrow loads pandas lazily),
    # which a Spark worker has paid before it reads.
    for _ in read_slice(_local(dataclasses.replace(parts[0], to_txid=parts[0].from_txid))):
        pass
    started = time.perf_counter()
    rows = 0
    for part in parts:
        rows += sum(batch.num_rows for batch in read_slice(_local(part)))
    return rows, time.perf_counter() - started


def export(
    storage: Path | None, output: Path, master: str, extra_args: Sequence[str] = ()
) -> tuple[dict[str, Any], float]:
    """The CLI's JSON summary and the command's wall-clock seconds (JVM start included): the
    export of ``storage`` (a directory), or of the cluster ``extra_args`` name when None."""
    if output.exists():
        shutil.rmtree(output)
    command = [
        sys.executable,
        "-m",
        "waltz_cli",  # the user's command, end to end
        "spark",
        "export",
        "--output",
        str(output),
        "--master",
        master,
        "--json",
        *extra_args,
        # A directory alone has no committed bound: all of the generated log is committed.
        *([] if storage is None else ["--to-txid", str(MAX_TXID), str(storage)]),
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        reason = next(
            (line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else ""
        )
        raise BenchError(f"waltz spark export failed (exit {result.returncode}): {reason}")
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary, seconds


def export_warm(storage: Path, directory: Path, master: str, runs: int) -> list[float]:
    """rows/s of ``runs`` exports in one session after an untimed first one: what a long-lived
    driver sustains once the JVM's JIT and Spark's Python workers are warm."""
    from spark.export import ExportConfig, run_export, spark_session

    session = spark_session(master)
    config = ExportConfig(output=directory, read_options=_read_options(storage))
    rates = []
    try:
        for run in range(runs + 1):
            output = directory / f"{WARM_EXPORT_DIR_PREFIX}{run}"
            shutil.rmtree(output, ignore_errors=True)
            summary = run_export(session, dataclasses.replace(config, output=output))
            shutil.rmtree(output)
            if run > 0:
                rates.append(summary.rows_per_s)
    finally:
        session.stop()
    return rates


def log_figures(
    rows: int, partitions: int, data_bytes: int, master: str, generate_s: float
) -> dict[str, Any]:
    """The report's part that says what log was measured (every bench export has it)."""
    return {
        "rows": rows,
        "partitions": partitions,
        "data_bytes": data_bytes,
        "master": master,
        "generate_s": round(generate_s, 2),
    }


def export_figures(prefix: str, summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """One export's figures under ``prefix``: rows, the export's own seconds and rows/s, and the
    whole command's seconds (Spark's start included)."""
    return {
        f"{prefix}_rows": summary["rows"],
        f"{prefix}_s": round(summary["seconds"], 3),
        f"{prefix}_rows_per_s": round(summary["rows_per_s"]),
        f"{prefix}_command_s": round(wall_s, 2),
    }


def run(
    directory: Path,
    rows: int = DEFAULT_ROWS,
    partitions: int = DEFAULT_PARTITIONS,
    data_bytes: int = DEFAULT_DATA_BYTES,
    master: str = DEFAULT_MASTER,
    export_once: bool = True,
    warm_runs: int = 0,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Generate (or reuse) the log under ``directory``, then measure; the report as JSON."""
    storage = directory / STORAGE_DIR_NAME
    progress(f"log of {rows:,} transactions x {data_bytes} B over {partitions} partitions")
    generate_s = generate(storage, rows, partitions, data_bytes)
    progress("parsing every segment in this process")
    parsed_rows, parse_s = parse_all(storage)
    result = log_figures(rows, partitions, data_bytes, master, generate_s) | {
        "parse_rows": parsed_rows,
        "parse_s": round(parse_s, 3),
        "parse_rows_per_s": round(parsed_rows / parse_s),
    }
    if export_once:
        progress(f"waltz spark export --master {master}")
        summary, wall_s = export(storage, directory / EXPORT_DIR_NAME, master)
        result |= export_figures("export", summary, wall_s)
        result["export_vs_parse"] = round(summary["rows_per_s"] / (parsed_rows / parse_s), 3)
    if warm_runs > 0:
        progress(f"{warm_runs} warm export(s) in one session")
        rates = export_warm(storage, directory, master, warm_runs)
        result |= {
            "warm_export_rows_per_s": [round(r) for r in rates],
            "warm_export_vs_parse": [round(r / (parsed_rows / parse_s), 3) for r in rates],
        }
    return result
