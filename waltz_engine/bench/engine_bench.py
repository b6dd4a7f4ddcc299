"""`waltz bench engine`: append throughput of the on-disk engine beside a raw write+fsync loop.

For each batch size the engine appends 1 KiB records (one fsync'd append call per batch) to
a fresh storage directory; a raw loop writes the same bytes per batch to one file and
fsyncs, the same number of times, on the same disk, in alternating rounds. The ratio engine/raw shows what the
engine costs on top of the disk's own sync latency.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage import StorageManager

RECORD_DATA_BYTES = 1024
DEFAULT_BATCH_SIZES = (1, 10, 100)
DEFAULT_SECONDS_PER_RUN = 3.0
# Distinct payloads, so neither side writes one buffer over and over.
PAYLOAD_POOL_SIZE = 64
# Engine and raw loop alternate this many times: a virtual disk's latency drifts.
ROUNDS = 5
BYTES_PER_MB = 1_000_000


@dataclass(frozen=True)
class LoopResult:
    records: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.records * RECORD_DATA_BYTES / self.seconds / BYTES_PER_MB


@dataclass(frozen=True)
class BatchResult:
    batch_size: int
    engine: LoopResult
    raw: LoopResult

    @property
    def ratio(self) -> float:
        """Engine records/s over raw records/s (1.0 = as fast as the disk allows)."""
        return self.engine.records_per_s / self.raw.records_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "engine": asdict(self.engine) | _rates(self.engine),
            "raw": asdict(self.raw) | _rates(self.raw),
            "ratio": round(self.ratio, 3),
        }


def _rates(result: LoopResult) -> dict[str, float]:
    return {"records_per_s": round(result.records_per_s, 1), "mb_per_s": round(result.mb_per_s, 3)}


class _Budget:
    """Stops a loop after a number of records or of seconds, whichever was asked for."""

    def __init__(self, seconds: float | None, records: int | None) -> None:
        assert (seconds is None) != (records is None), "give seconds or records"
        self.seconds = seconds
        self.records = records

    def exhausted(self, started_s: float, records_done: int) -> bool:
        if self.records is not None:
            return records_done >= self.records
        assert self.seconds is not None
        return time.perf_counter() - started_s >= self.seconds


def make_payloads() -> list[tuple[bytes, int]]:
    payloads = [os.urandom(RECORD_DATA_BYTES) for _ in range(PAYLOAD_POOL_SIZE)]
    return [(p, crc32(p)) for p in payloads]


class _EngineLoop:
    """Appends batches to one partition of a fresh storage directory."""

    def __init__(self, directory: Path, batch_size: int) -> None:
        directory.mkdir()
        self.manager = StorageManager(directory, uuid.uuid4(), 1)
        self.manager.set_partition_assignment([0], True)
        self.partition = self.manager.partition(0)
        self.batch_size = batch_size
        self.payloads = make_payloads()
        self.next_txid = 0

    def run(self, budget: _Budget) -> LoopResult:
        """Only the append calls are timed: building Record objects is the network decoder's
        work in a node, not the engine's."""
        first_txid = self.next_txid
        started_s = time.perf_counter()
        appending_s = 0.0
        while not budget.exhausted(started_s, self.next_txid - first_txid):
            batch = []
            for txid in range(self.next_txid, self.next_txid + self.batch_size):
                data, checksum = self.payloads[txid % PAYLOAD_POOL_SIZE]
                batch.append(Record(txid, ReqId(1, 1, 0, txid), 0, data, checksum))
            append_started_s = time.perf_counter()
            self.partition.append(batch)
            appending_s += time.perf_counter() - append_started_s
            self.next_txid += self.batch_size
        return LoopResult(self.next_txid - first_txid, appending_s)

    def close(self) -> None:
        self.manager.close()


class RawLoop:
    """Writes ``batch_size`` KiB to one file, then fsyncs it: the disk's own cost."""

    def __init__(self, directory: Path, batch_size: int) -> None:
        payloads = make_payloads()
        self.buffers = [
            b"".join(payloads[(i + j) % PAYLOAD_POOL_SIZE][0] for j in range(batch_size))
            for i in range(PAYLOAD_POOL_SIZE)
        ]
        self.batch_size = batch_size
        self.fd = os.open(directory / "raw.dat", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def run(self, batches: int) -> LoopResult:
        fd, buffers = self.fd, self.buffers
        started_s = time.perf_counter()
        for i in range(batches):
            os.write(fd, buffers[i % PAYLOAD_POOL_SIZE])
            os.fsync(fd)
        return LoopResult(batches * self.batch_size, time.perf_counter() - started_s)

    def close(self) -> None:
        os.close(self.fd)


def _total(results: list[LoopResult]) -> LoopResult:
    return LoopResult(sum(r.records for r in results), sum(r.seconds for r in results))


def run(
    directory: Path,
    *,
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    seconds: float | None = None,
    records: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[BatchResult]:
    """Engine and raw loop for each batch size, in fresh sub-directories of ``directory``.

    The budget is split in ``ROUNDS`` alternating engine/raw rounds (raw writes as many
    batches as the engine just did), so both sides see the same disk weather.
    """
    if seconds is None and records is None:
        seconds = DEFAULT_SECONDS_PER_RUN
    budget = _Budget(
        None if seconds is None else seconds / ROUNDS,
        None if records is None else max(1, records // ROUNDS),
    )
    results = []
    for batch_size in batch_sizes:
        work = directory / f"waltz-bench-engine-{os.getpid()}-{batch_size}"
        work.mkdir(parents=True)
        try:
            progress(f"batch {batch_size}: {ROUNDS} rounds of engine, then raw write+fsync")
            engine_loop, raw_loop = _EngineLoop(work / "storage", batch_size), RawLoop(work, batch_size)
            engine_rounds, raw_rounds = [], []
            try:
                for _ in range(ROUNDS):
                    engine_rounds.append(engine_loop.run(budget))
                    raw_rounds.append(raw_loop.run(engine_rounds[-1].records // batch_size))
            finally:
                engine_loop.close()
                raw_loop.close()
        finally:
            shutil.rmtree(work)
        results.append(BatchResult(batch_size, _total(engine_rounds), _total(raw_rounds)))
    return results
