"""Crash safety with real processes: SIGKILL a writer at random moments, reopen, compare.

After each kill the directory must hold exactly the acknowledged operations plus a legal
outcome of the one in flight (a prefix of its batch, a partial truncate, either session
struct), with clean files: every index entry rebuilt, no bytes after the last record.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import storage_crash_writer as writer
from storage_crash_writer import Append, Model, Op, SetLowWaterMark, Truncate, Workload

from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES, SegmentFileHeader
from waltz_engine.disk.record_format import (
    CHECKPOINT_INTERVAL,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    DiskRecord,
    read_record,
)

KILLS = 20
MAX_OPS_BEFORE_KILL = 40
# Share of kills aimed at start-up (imports, lock, recovery) instead of between ops.
STARTUP_KILL_SHARE = 0.2
STARTUP_KILL_MAX_DELAY_S = 0.4
BETWEEN_OPS_MAX_DELAY_S = 0.003
# Share of in-flight appends turned into a torn write before recovery, and its garbage tail.
TORN_WRITE_SHARE = 0.5
TORN_GARBAGE_MAX_BYTES = 80


def _scan_files(partition_dir: Path) -> list[Record]:
    """Read every segment without the engine; assert each file is clean and indexed."""
    records: list[Record] = []
    for seg_path in sorted(partition_dir.glob("*.seg")):
        seg, idx = seg_path.read_bytes(), seg_path.with_suffix(".idx").read_bytes()
        first = SegmentFileHeader.from_bytes(seg).first_transaction_id
        assert SegmentFileHeader.from_bytes(idx).first_transaction_id == first
        assert first == len(records), f"{seg_path.name} does not continue the previous segment"
        offset = HEADER_SIZE_BYTES
        entries = (len(idx) - HEADER_SIZE_BYTES) // INDEX_ENTRY_SIZE_BYTES
        assert len(idx) == HEADER_SIZE_BYTES + entries * INDEX_ENTRY_SIZE_BYTES
        for i in range(entries):
            assert INDEX_ENTRY.unpack_from(idx, HEADER_SIZE_BYTES + i * INDEX_ENTRY_SIZE_BYTES)[0] == offset
            parsed = read_record(seg, offset)
            assert isinstance(parsed, DiskRecord) and parsed.record_checksum_ok and parsed.checksum_ok
            assert parsed.record.transaction_id == first + i
            records.append(parsed.record)
            offset += parsed.size_bytes
        assert offset == len(seg), f"{seg_path.name} has {len(seg) - offset} bytes after its last record"
    assert sorted(partition_dir.glob("*.idx")) == sorted(
        p.with_suffix(".idx") for p in partition_dir.glob("*.seg")
    )
    return records


def _check_outcome(before: Model, in_flight: Op | None, actual: Model) -> None:
    """``actual`` is ``before`` plus a legal outcome of the op in flight (None: none started)."""
    if isinstance(in_flight, Append):
        assert actual.records[: len(before.records)] == before.records
        assert (
            actual.records[len(before.records) :]
            == in_flight.records[: len(actual.records) - len(before.records)]
        )
    elif isinstance(in_flight, Truncate):
        assert in_flight.transaction_id + 1 <= len(actual.records) <= len(before.records)
        assert actual.records == before.records[: len(actual.records)]
    else:
        assert actual.records == before.records
    allowed_sessions = {before.session}
    if isinstance(in_flight, SetLowWaterMark):
        allowed_sessions.add(
            before.session._replace(
                session_id=in_flight.session_id,
                low_water_mark=in_flight.low_water_mark,
                local_low_water_mark=before.max_transaction_id,
            )
        )
    assert actual.session in allowed_sessions


def _tear_in_flight_append(partition_dir: Path, acknowledged: list[Record], rng: random.Random) -> None:
    """Turn the in-flight append into a torn write: drop segments it rolled over to, cut its
    data at a random byte, drop its index entries and leave garbage after the cut.

    SIGKILL alone never tears a single pwrite, but a partial write may; this is the state
    it leaves (data is written before index entries).
    """
    by_first = {int(p.stem): p for p in partition_dir.glob("*.seg")}
    first = max(f for f in by_first if f <= len(acknowledged))
    for later in (f for f in by_first if f > first):
        by_first[later].unlink()
        by_first[later].with_suffix(".idx").unlink()
    seg_path, idx_path = by_first[first], by_first[first].with_suffix(".idx")
    acknowledged_end = HEADER_SIZE_BYTES + sum(40 + len(r.data) for r in acknowledged[first:])
    if seg_path.stat().st_size < acknowledged_end:
        # Killed as it rolled over, before the new segment's header was written: it holds no
        # acknowledged record (those were fsynced) and nothing is in flight to tear.
        assert first == len(acknowledged), (first, len(acknowledged))
        return
    with seg_path.open("r+b") as f:
        f.truncate(rng.randint(acknowledged_end, seg_path.stat().st_size))
        f.seek(0, os.SEEK_END)
        f.write(rng.randbytes(rng.randint(0, TORN_GARBAGE_MAX_BYTES)))
    with idx_path.open("r+b") as f:
        f.truncate(HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (len(acknowledged) - first))


def _recover(directory: Path) -> Model:
    with writer.open_manager(directory) as manager:
        model = writer.read_model(manager)
    assert _scan_files(directory / str(writer.PARTITION)) == model.records
    return model


def _run_and_kill(directory: Path, seed: int, rng: random.Random) -> int | None:
    """Start the writer and SIGKILL it. Return how many ops it acknowledged, or None when it
    was killed before it was ready (no op started)."""
    script = Path(writer.__file__)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(directory), str(seed)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        if rng.random() < STARTUP_KILL_SHARE:
            time.sleep(rng.uniform(0, STARTUP_KILL_MAX_DELAY_S))
        else:
            lines.append(proc.stdout.readline())
            assert lines[0] == "ready\n"
            for _ in range(rng.randint(0, MAX_OPS_BEFORE_KILL)):
                lines.append(proc.stdout.readline())
                assert lines[-1].startswith("done ")
            time.sleep(rng.uniform(0, BETWEEN_OPS_MAX_DELAY_S))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        lines += proc.stdout.read().splitlines(keepends=True)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if "ready\n" not in lines:
        return None
    done = [int(line.split()[1]) for line in lines if line.startswith("done ")]
    assert done == list(range(len(done))), "the writer acknowledges ops in order"
    return len(done)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_acknowledged_operation(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    model = _recover(tmp_path)
    total_ops = 0
    for _ in range(KILLS):
        seed = rng.randrange(1 << 30)
        acknowledged = _run_and_kill(tmp_path, seed, rng)
        workload = Workload(seed, Model(list(model.records), model.session))
        for _ in range(acknowledged or 0):
            workload.next_op()
        before = Model(list(workload.model.records), workload.model.session)
        in_flight = None if acknowledged is None else workload.next_op()
        if isinstance(in_flight, Append) and rng.random() < TORN_WRITE_SHARE:
            _tear_in_flight_append(tmp_path / str(writer.PARTITION), before.records, rng)
        actual = _recover(tmp_path)
        _check_outcome(before, in_flight, actual)
        model = actual
        total_ops += acknowledged or 0
    # The run must have done real work: many ops, rollovers and an index checkpoint crossed.
    print(f"{total_ops} ops, max txid {model.max_transaction_id}")
    assert total_ops > KILLS
    assert len(list((tmp_path / str(writer.PARTITION)).glob("*.seg"))) > 1
    assert model.max_transaction_id >= CHECKPOINT_INTERVAL
