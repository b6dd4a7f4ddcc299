"""Segments and partitions: rollover, checkpoints, truncation, finder, LRU, leftovers."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
from storage_support import open_one_partition

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import CHECKPOINT_INTERVAL, INDEX_ENTRY_SIZE_BYTES, RECORD_OVERHEAD_BYTES
from waltz_engine.storage import StorageManager
from waltz_engine.storage.lru import LRUCache
from waltz_engine.storage.segment_finder import find_segment

KEY = uuid.UUID("2f1e6b0c-7d3a-4c59-b0e2-8a1d5c3f9e67")
DATA_BYTES = 50
RECORD_BYTES = RECORD_OVERHEAD_BYTES + DATA_BYTES


def _records(first: int, count: int) -> list[Record]:
    return [
        Record(t, ReqId(1, 1, 0, t), t, data, crc32(data))
        for t in range(first, first + count)
        for data in (t.to_bytes(8, "big") * (DATA_BYTES // 8) + b"zz",)
    ]


def _manager(directory: Path, threshold_bytes: int, cache_capacity: int = 5) -> StorageManager:
    return open_one_partition(
        directory, KEY, segment_size_threshold_bytes=threshold_bytes, segment_cache_capacity=cache_capacity
    )


class _Span(NamedTuple):
    first_transaction_id: int
    max_transaction_id: int


def test_find_segment() -> None:
    spans = [_Span(0, 9), _Span(10, 10), _Span(11, 30), _Span(31, 30)]
    assert [find_segment(spans, t) for t in (-1, 0, 9, 10, 11, 30, 31)] == [
        None,
        spans[0],
        spans[0],
        spans[1],
        spans[2],
        spans[2],
        None,
    ]


def test_lru_evicts_the_least_recently_used() -> None:
    evicted: list[str] = []
    cache: LRUCache[str] = LRUCache(2, evicted.append)
    for key in ("a", "b", "a", "c", "d"):
        cache.touch(key)
    assert evicted == ["b", "a"] and "c" in cache and "d" in cache
    cache.remove("c")
    cache.touch("e")
    assert evicted == ["b", "a"] and len(cache) == 2


def test_rollover_stops_one_record_past_the_threshold(tmp_path: Path) -> None:
    threshold = HEADER_SIZE_BYTES + 10 * RECORD_BYTES + 1  # 11 records per segment
    with _manager(tmp_path, threshold) as manager:
        partition = manager.partition(0)
        partition.append(_records(0, 25))
        partition.append(_records(25, 1))
        assert partition.segments == [(0, 10), (11, 21), (22, 25)]
    sizes = sorted((p.name, p.stat().st_size) for p in (tmp_path / "0").iterdir())
    assert sizes[:2] == [
        ("0000000000000000000.idx", HEADER_SIZE_BYTES + 11 * INDEX_ENTRY_SIZE_BYTES),
        ("0000000000000000000.seg", HEADER_SIZE_BYTES + 11 * RECORD_BYTES),
    ]


def test_a_batch_is_synced_at_each_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}")[-4:], os.fstat(fd).st_size))
        real_fsync(fd)

    with _manager(tmp_path, 10**9) as manager:
        partition = manager.partition(0)
        partition.append(_records(0, 10))
        monkeypatch.setattr(os, "fsync", recording_fsync)
        partition.append(_records(10, 2 * CHECKPOINT_INTERVAL + 5))
        monkeypatch.undo()
    # Index then data, right after txid 999 and 1999 (the data file holds exactly up to there).
    assert synced == [
        (".idx", HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * CHECKPOINT_INTERVAL),
        (".seg", HEADER_SIZE_BYTES + RECORD_BYTES * CHECKPOINT_INTERVAL),
        (".idx", HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * 2 * CHECKPOINT_INTERVAL),
        (".seg", HEADER_SIZE_BYTES + RECORD_BYTES * 2 * CHECKPOINT_INTERVAL),
    ]


def test_out_of_order_batches_are_refused_whole(tmp_path: Path) -> None:
    with _manager(tmp_path, 10**9) as manager:
        partition = manager.partition(0)
        partition.append(_records(0, 3))
        for bad in (_records(4, 2), _records(2, 2), _records(3, 1) + _records(5, 1)):
            with pytest.raises(StorageError, match="transaction out of order"):
                partition.append(bad)
        partition.append([])
        assert partition.max_transaction_id() == 2
        assert (
            tmp_path / "0" / "0000000000000000000.seg"
        ).stat().st_size == HEADER_SIZE_BYTES + 3 * RECORD_BYTES


def test_truncate_deletes_later_segments_and_reopens_sealed_ones(tmp_path: Path) -> None:
    threshold = HEADER_SIZE_BYTES + 4 * RECORD_BYTES  # 5 records per segment
    with _manager(tmp_path, threshold, cache_capacity=1) as manager:
        partition = manager.partition(0)
        partition.append(_records(0, 23))
        assert [s[0] for s in partition.segments] == [0, 5, 10, 15, 20]
        assert partition.truncate(30) == 22
        assert partition.truncate(10) == 10  # 15.. and 20.. deleted; 10.. keeps one record
        assert partition.segments == [(0, 4), (5, 9), (10, 10)]
        assert partition.truncate(9) == 9  # segment 10 becomes empty and stays current
        assert partition.segments == [(0, 4), (5, 9), (10, 9)]
        assert partition.truncate(2) == 2
        with pytest.raises(StorageError, match="out of range"):
            partition.truncate(-2)
        partition.append(_records(3, 9))
        assert partition.records(0, 100) == _records(0, 12)
    names = sorted(p.name for p in (tmp_path / "0").iterdir())
    assert names == [f"{f:019d}.{ext}" for f in (0, 5, 10) for ext in ("idx", "seg")]
    with _manager(tmp_path, threshold) as manager:
        assert manager.partition(0).records(0, 100) == _records(0, 12)


def test_leftovers_of_an_interrupted_rollover_are_removed(tmp_path: Path) -> None:
    threshold = HEADER_SIZE_BYTES + 4 * RECORD_BYTES
    with _manager(tmp_path, threshold) as manager:
        manager.partition(0).append(_records(0, 7))
    directory = tmp_path / "0"
    (directory / "0000000000000000007.idx").write_bytes(b"")  # created, header not written
    (directory / "0000000000000000007.seg").write_bytes(b"\0" * 10)
    (directory / "0000000000000000099.idx").write_bytes(b"\0" * 200)  # .seg already deleted
    with _manager(tmp_path, threshold) as manager:
        partition = manager.partition(0)
        assert partition.segments == [(0, 4), (5, 6)]
        partition.append(_records(7, 1))
        assert partition.segments == [(0, 4), (5, 7)]
        assert partition.records(0, 100) == _records(0, 8)
    assert not (directory / "0000000000000000099.idx").exists()


def test_checksum_covers_all_data_after_the_headers(tmp_path: Path) -> None:
    threshold = HEADER_SIZE_BYTES + 4 * RECORD_BYTES
    with _manager(tmp_path, threshold, cache_capacity=0) as manager:
        partition = manager.partition(0)
        partition.append(_records(0, 12))
        data = b"".join(p.read_bytes()[HEADER_SIZE_BYTES:] for p in sorted((tmp_path / "0").glob("*.seg")))
        assert partition.checksum() == crc32(data)
