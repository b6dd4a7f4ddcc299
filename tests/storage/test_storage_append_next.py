"""The storage node's lone append (issue 33): ``Partition.append_next`` writes a request's records
as ``Partition.append`` does, byte for byte, across a checkpoint and a segment's roll-over, and
does nothing where ``append`` would meet something in its way (the general path then meets it,
with its errors)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from storage_testlib import storage_files, without_creation_time

from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_format import CHECKPOINT_INTERVAL
from waltz_engine.disk.record_run import RecordList, WireRecordRun, read_wire_record_run
from waltz_engine.storage import StorageManager
from waltz_engine.storage.partition import Partition
from waltz_engine.wire.primitives import write_records

KEY = uuid.UUID("9a6f2b1c-0d2e-4f3a-8b5c-6d7e8f901234")
# Small segments: a few records each, so the appends below roll over several times.
THRESHOLD_BYTES = 400
# The log begins a few records before a checkpoint, so that the appends cross it.
FIRST_TXID = CHECKPOINT_INTERVAL - 5
COUNT = 12
# Data sizes drawn from: empty, small and a few that fill a segment at once.
DATA_SIZES = (0, 7, 300, 300)


def _records(rng: random.Random) -> list[Record]:
    return [
        Record(
            FIRST_TXID + i, ReqId(1, 2, 3, i), rng.randint(-5, 5), rng.randbytes(rng.choice(DATA_SIZES)), i
        )
        for i in range(COUNT)
    ]


def _run(records: list[Record]) -> WireRecordRun:
    out = bytearray()
    write_records(out, records)
    run, _ = read_wire_record_run(bytes(out), 0)
    return run


def _partition(manager: StorageManager) -> Partition:
    manager.set_partition_assignment([0], True)
    partition = manager.partition(0)
    partition.start_at(FIRST_TXID)
    return partition


def _segments(directory: Path) -> dict[str, bytes]:
    return {
        name: without_creation_time(data)
        for name, data in storage_files(directory).items()
        if name.endswith((".seg", ".idx"))
    }


def test_append_next_writes_what_append_writes(tmp_path: Path) -> None:
    records = _records(random.Random(33))
    (tmp_path / "one-by-one").mkdir()
    (tmp_path / "at-once").mkdir()
    with StorageManager(
        tmp_path / "one-by-one", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES
    ) as manager:
        partition = _partition(manager)
        for record in records:
            span = partition.append_next(_run([record]))
            assert span == (FIRST_TXID, record.transaction_id)
    with StorageManager(
        tmp_path / "at-once", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES
    ) as manager:
        _partition(manager).append(RecordList(records).records)
    one_by_one, at_once = _segments(tmp_path / "one-by-one"), _segments(tmp_path / "at-once")
    assert len(one_by_one) > 4  # (several segments and their indexes)
    assert one_by_one == at_once


def test_append_next_does_nothing_where_append_would_meet_something(tmp_path: Path) -> None:
    records = _records(random.Random(34))
    with StorageManager(tmp_path, KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        partition = _partition(manager)
        assert partition.append_next(_run([records[1]])) is None  # not the next txid
        assert partition.append_next(_run([])) is None  # no records
        assert partition.append_next(_run([records[0], records[2]])) is None  # not consecutive
        assert partition.max_transaction_id() == FIRST_TXID - 1
        assert partition.append_next(_run(records[:2])) == (FIRST_TXID, FIRST_TXID + 1)
        partition.close()
        assert partition.append_next(_run([records[2]])) is None  # closed
