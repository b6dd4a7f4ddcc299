"""Appends made durable by their disk pass's one sync (issue 33): ``Partition.append_held`` and
``PassSyncs``, on real files. Nothing reads a held record before its sync returned; a failed
whole-disk sync fails and cuts back every partition it covered, a failed write only its own;
the next appends succeed; a reopen reads every acknowledged record and nothing else."""

from __future__ import annotations

import errno
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from storage_support import FaultyDisk

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_run import WireRecordRun, read_wire_record_run
from waltz_engine.storage import StorageManager
from waltz_engine.storage.file_system import OS_DISK
from waltz_engine.storage.held_append import HeldAppend, PassSyncs, Span
from waltz_engine.wire.primitives import write_records

KEY = uuid.UUID("0b1d2c3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e")
PARTITIONS = 3
WAIT_S = 10.0


def _run(partition_id: int, first: int, count: int) -> WireRecordRun:
    records = []
    for txid in range(first, first + count):
        data = f"partition {partition_id} transaction {txid}".encode()
        records.append(Record(txid, ReqId(1, 2, partition_id, txid), 0, data, to_signed32(zlib.crc32(data))))
    out = bytearray()
    write_records(out, records)
    run, _ = read_wire_record_run(bytes(out), 0)
    return run


def _open(directory: Path, disk: Any = OS_DISK) -> StorageManager:
    manager = StorageManager(directory, KEY, PARTITIONS, disk=disk)
    manager.set_partition_assignment(list(range(PARTITIONS)), True)
    return manager


Settled = list[tuple[int, Any, Span]]


def _hold_all(manager: StorageManager, syncs: PassSyncs, first: int, settled: Settled) -> None:
    for p in range(PARTITIONS):
        held = manager.partition(p).append_held(_run(p, first, 2))
        assert isinstance(held, HeldAppend)
        syncs.hold(held, lambda error, span, p=p: settled.append((p, error, span)))


def test_a_held_record_is_not_read_before_its_sync(tmp_path: Path) -> None:
    disk = FaultyDisk()
    with _open(tmp_path, disk) as manager:
        syncs = PassSyncs(lambda: disk.sync_all(tmp_path))
        settled: Settled = []
        _hold_all(manager, syncs, 0, settled)
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.append(manager.partition(1).max_transaction_id()))
        reader.start()
        reader.join(0.2)
        assert reader.is_alive() and not seen  # the partition is held until the pass's sync
        syncs.finish()
        reader.join(WAIT_S)
        assert seen == [1]
        assert settled == [(p, None, (0, 1)) for p in range(PARTITIONS)]
        assert (disk.whole_syncs, disk.file_syncs) == (1, 0)  # one sync for three partitions
    with _open(tmp_path) as manager:
        assert [len(manager.partition(p).records(0, 10)) for p in range(PARTITIONS)] == [2] * PARTITIONS


def test_one_partition_held_alone_syncs_its_own_file(tmp_path: Path) -> None:
    disk = FaultyDisk()
    with _open(tmp_path, disk) as manager:
        syncs = PassSyncs(lambda: disk.sync_all(tmp_path))
        held = manager.partition(0).append_held(_run(0, 0, 1))
        assert held is not None
        syncs.hold(held, lambda error, span: None)
        syncs.finish()
        assert (disk.whole_syncs, disk.file_syncs) == (0, 1)
        assert manager.partition(0).max_transaction_id() == 0


def test_a_failed_whole_disk_sync_fails_and_cuts_back_every_partition(tmp_path: Path) -> None:
    disk = FaultyDisk()
    with _open(tmp_path, disk) as manager:
        syncs = PassSyncs(lambda: disk.sync_all(tmp_path))
        settled: Settled = []
        _hold_all(manager, syncs, 0, settled)  # acknowledged: 0 and 1 of each partition
        syncs.finish()
        disk.failing_whole_syncs = 1
        _hold_all(manager, syncs, 2, settled)
        syncs.finish()
        failed = settled[PARTITIONS:]
        assert [(p, span) for p, _, span in failed] == [(p, (0, 1)) for p in range(PARTITIONS)]
        assert all(isinstance(error, OSError) and error.errno == errno.EIO for _, error, _ in failed)
        for p in range(PARTITIONS):
            assert manager.partition(p).max_transaction_id() == 1
        # The next appends take the same txids, and succeed.
        _hold_all(manager, syncs, 2, settled)
        syncs.finish()
        assert [error for _, error, _ in settled[2 * PARTITIONS :]] == [None] * PARTITIONS
        # A third pass that fails: never acknowledged, so never read after the reopen.
        disk.failing_whole_syncs = 1
        _hold_all(manager, syncs, 4, settled)
        syncs.finish()
    with _open(tmp_path) as manager:
        for p in range(PARTITIONS):
            partition = manager.partition(p)
            assert partition.max_transaction_id() == 3
            assert [r.transaction_id for r in partition.records(0, 10)] == [0, 1, 2, 3]
            assert partition.records(0, 10) == list(_run(p, 0, 4).records())


def test_a_failed_write_fails_only_its_partition(tmp_path: Path) -> None:
    disk = FaultyDisk()
    with _open(tmp_path, disk) as manager:
        syncs = PassSyncs(lambda: disk.sync_all(tmp_path))
        disk.failing_writes.add(manager.partition(1).directory)
        held = manager.partition(0).append_held(_run(0, 0, 2))
        assert held is not None
        syncs.hold(held, lambda error, span: None)
        with pytest.raises(OSError, match="Input/output error"):
            manager.partition(1).append_held(_run(1, 0, 2))
        # Cut back and released at once: readable (the lock is free) and empty.
        assert manager.partition(1).max_transaction_id() == -1
        syncs.finish()
        disk.failing_writes.clear()
        held = manager.partition(1).append_held(_run(1, 0, 1))
        assert held is not None
        syncs.hold(held, lambda error, span: None)
        syncs.finish()
    with _open(tmp_path) as manager:
        assert manager.partition(0).max_transaction_id() == 1
        assert manager.partition(1).max_transaction_id() == 0


def test_what_cannot_be_held_is_left_to_the_usual_append(tmp_path: Path) -> None:
    with _open(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.append_held(_run(0, 5, 1)) is None  # not the next txid
        assert partition.max_transaction_id() == -1  # (and the lock was released)
    (tmp_path / "small").mkdir()
    with StorageManager(tmp_path / "small", KEY, 1, segment_size_threshold_bytes=300) as manager:
        manager.set_partition_assignment([0], True)
        assert manager.partition(0).append_held(_run(0, 0, 5)) is None  # past the segment's end
        manager.partition(0).append(list(_run(0, 0, 5).records()))  # (rolls over, its own syncs)
