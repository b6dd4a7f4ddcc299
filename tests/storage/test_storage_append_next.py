"""The storage node's lone append (issue 33): ``Partition.append_next`` writes a request's records
as ``Partition.append`` does, byte for byte, across a checkpoint and a segment's roll-over, and
does nothing where ``append`` would meet something in its way (the general path then meets it,
with its errors). A run of one record is written by ``Segment.append_record`` (the lone
appender's, issue 33's fifth session): the same bytes, and the same cut-back after a failed write
or sync, also after a ``pwrite`` that took part of its bytes."""

from __future__ import annotations

import errno
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from storage_support import FaultyDisk
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


class _ShortWrites(FaultyDisk):
    """Every ``pwrite`` in the directories of ``short`` takes at most ``SHORT_WRITE_BYTES`` bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.short: set[Path] = set()

    def open(self, path: Path, **kwargs: bool) -> Any:
        file = super().open(path, **kwargs)
        return _ShortFile(file) if path.parent in self.short else file


SHORT_WRITE_BYTES = 5


class _ShortFile:
    def __init__(self, file: Any) -> None:
        self._file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def pwrite(self, data: bytes, offset: int) -> int:
        return int(self._file.pwrite(memoryview(data)[:SHORT_WRITE_BYTES], offset))


def test_disk_record_is_encode_of_one_record() -> None:
    for record in _records(random.Random(35)):
        run = _run([record])
        assert run.disk_record() == run.encode(0, 1, 1234)[0]


def test_a_pwrite_in_parts_writes_what_append_writes(tmp_path: Path) -> None:
    records = _records(random.Random(36))
    disk = _ShortWrites()
    disk.short.add(tmp_path / "parts" / "0")  # (partition 0's directory)
    (tmp_path / "parts").mkdir()
    (tmp_path / "whole").mkdir()
    with StorageManager(
        tmp_path / "parts", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES, disk=disk
    ) as manager:
        partition = _partition(manager)
        assert partition.directory in disk.short
        for record in records:
            assert partition.append_next(_run([record])) == (FIRST_TXID, record.transaction_id)
    with StorageManager(tmp_path / "whole", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        _partition(manager).append(RecordList(records).records)
    assert _segments(tmp_path / "parts") == _segments(tmp_path / "whole")


@pytest.mark.parametrize("fault", ["write", "sync"])
def test_a_failed_write_or_sync_is_cut_back_as_append_cuts_it(tmp_path: Path, fault: str) -> None:
    """Each record's append fails once (a write or a sync), then succeeds: the files are those of
    ``append`` failing the same way, after each failure and at the end, and the log is whole. (The
    append that reaches a checkpoint syncs with ``fsync``, which these faults leave alone.)"""
    records = _records(random.Random(37))
    disks = {"next": FaultyDisk(), "general": FaultyDisk()}
    managers = {}
    for name, disk in disks.items():
        (tmp_path / name).mkdir()
        managers[name] = StorageManager(
            tmp_path / name, KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES, disk=disk
        )
    try:
        partitions = {name: _partition(manager) for name, manager in managers.items()}
        appends: dict[str, Callable[[Record], object]] = {
            "next": lambda record: partitions["next"].append_next(_run([record])),
            "general": lambda record: partitions["general"].append(RecordList([record]).records),
        }
        for record in records:
            checkpoint = (record.transaction_id + 1) % CHECKPOINT_INTERVAL == 0
            for name, disk in disks.items() if fault == "write" or not checkpoint else ():
                faults = disk.failing_writes if fault == "write" else disk.failing
                faults.add(partitions[name].directory)
                with pytest.raises(OSError) as raised:
                    appends[name](record)
                assert raised.value.errno == errno.EIO
                assert partitions[name].max_transaction_id() == record.transaction_id - 1
                faults.clear()
            assert _segments(tmp_path / "next") == _segments(tmp_path / "general")
            for name in disks:
                appends[name](record)
                assert partitions[name].max_transaction_id() == record.transaction_id
    finally:
        for manager in managers.values():
            manager.close()
    (tmp_path / "clean").mkdir()
    with StorageManager(tmp_path / "clean", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        _partition(manager).append(RecordList(records).records)
    assert _segments(tmp_path / "next") == _segments(tmp_path / "general") == _segments(tmp_path / "clean")
