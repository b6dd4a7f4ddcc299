"""Lock hash (client) and lock table (server) against the original's golden vectors (§2.6)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import read_jsonl

from waltz_engine.common.lock_hash import java_long_hash, partition_local_lock_hash
from waltz_engine.server.locks import (
    DEFAULT_LOCK_TABLE_SIZE,
    NO_LOCK_HIGH_WATER_MARK,
    NUM_HASH_FUNCS,
    LockRequest,
    Locks,
    lock_hash_chain,
    lock_slots,
)
from waltz_engine.zk.java_io import java_string_hash

NUM_LOCK_HASH_VECTORS = 93
NUM_SCENARIO_STEPS = 25
SCENARIO_INITIAL_HIGH_WATER_MARK = 10


def _lock_hash_vectors(vectors: Path) -> list[dict[str, Any]]:
    lines = read_jsonl(vectors / "locks" / "lock_hashes.jsonl")
    assert len(lines) == NUM_LOCK_HASH_VECTORS
    return lines


def test_client_lock_hash_matches_partition_local_lock(vectors: Path) -> None:
    for line in _lock_hash_vectors(vectors):
        name, lock_id = line["name"], line["id"]
        assert isinstance(name, str) and isinstance(lock_id, int)
        assert name.encode("utf-8").hex() == line["name_utf8_hex"], line
        assert java_string_hash(name) == line["name_hashCode"], line
        assert java_long_hash(lock_id) == line["id_hashCode"], line
        assert partition_local_lock_hash(name, lock_id) == line["lock_hashCode"], line


def test_lcg_chain_and_slots_match_the_original(vectors: Path) -> None:
    for line in _lock_hash_vectors(vectors):
        lock_hash, table_size = line["lock_hashCode"], line["table_size"]
        assert isinstance(lock_hash, int) and isinstance(table_size, int)
        assert lock_hash_chain(lock_hash) == line["lcg_chain"], line
        assert lock_slots(lock_hash, table_size) == line["slots"], line


def test_begin_marks_and_commit_writes_exactly_the_vector_slots(vectors: Path) -> None:
    initial_high_water_mark = 7
    for line in _lock_hash_vectors(vectors):
        lock_hash, table_size, slots = line["lock_hashCode"], line["table_size"], line["slots"]
        assert isinstance(lock_hash, int) and isinstance(table_size, int) and isinstance(slots, list)
        locks = Locks(table_size, NUM_HASH_FUNCS, initial_high_water_mark)
        request = LockRequest([lock_hash], [], [])
        assert locks.begin(request)
        marked = [slot for slot in range(table_size) if locks.is_in_flight(slot)]
        assert marked == sorted(set(slots)), line
        locks.commit(request, 99)
        written = [slot for slot in range(table_size) if locks.slot_high_water_mark(slot) == 99]
        assert written == sorted(set(slots)), line
        locks.end(request)
        assert not any(locks.is_in_flight(slot) for slot in slots)


def _acct(lock_id: int) -> int:
    return partition_local_lock_hash("acct", lock_id)


def _write(*ids: int) -> LockRequest:
    return LockRequest([_acct(i) for i in ids], [], [])


def _read(*ids: int) -> LockRequest:
    return LockRequest([], [_acct(i) for i in ids], [])


def _append(*ids: int) -> LockRequest:
    return LockRequest([], [], [_acct(i) for i in ids])


def _commit_and_end(locks: Locks, request: LockRequest, transaction_id: int) -> None:
    locks.commit(request, transaction_id)
    locks.end(request)


def test_lock_table_scenario_step_by_step(vectors: Path) -> None:
    steps = read_jsonl(vectors / "locks" / "lock_table_scenario.jsonl")
    assert len(steps) == NUM_SCENARIO_STEPS
    locks = Locks(DEFAULT_LOCK_TABLE_SIZE, NUM_HASH_FUNCS, SCENARIO_INITIAL_HIGH_WATER_MARK)
    script: list[tuple[str, Callable[[], object]]] = [
        ("new Locks(30000, 3, 10)", lambda: None),
        ("getLockHighWaterMark(write[acct/1])", lambda: locks.get_lock_high_water_mark(_write(1))),
        ("begin(write[acct/1])", lambda: locks.begin(_write(1))),
        ("begin(read[acct/1]) while write[acct/1] in flight", lambda: locks.begin(_read(1))),
        ("begin(write[acct/2])", lambda: locks.begin(_write(2))),
        ("numActiveLocks()", locks.num_active_locks),
        ("commit(write[acct/1], 11)", lambda: locks.commit(_write(1), 11)),
        ("end(write[acct/1])", lambda: locks.end(_write(1))),
        ("getLockHighWaterMark(write[acct/1])", lambda: locks.get_lock_high_water_mark(_write(1))),
        ("getLockHighWaterMark(read[acct/1])", lambda: locks.get_lock_high_water_mark(_read(1))),
        (
            "getLockHighWaterMark(write[acct/1, acct/2])",
            lambda: locks.get_lock_high_water_mark(_write(1, 2)),
        ),
        ("begin(read[acct/1])", lambda: locks.begin(_read(1))),
        ("commit(read[acct/1], 12) (read locks are not committed)", lambda: locks.commit(_read(1), 12)),
        ("end(read[acct/1])", lambda: locks.end(_read(1))),
        ("getLockHighWaterMark(read[acct/1])", lambda: locks.get_lock_high_water_mark(_read(1))),
        (
            "getLockHighWaterMark(append[acct/1]) (append locks are not checked)",
            lambda: locks.get_lock_high_water_mark(_append(1)),
        ),
        ("begin(append[acct/1])", lambda: locks.begin(_append(1))),
        ("commit(append[acct/1], 13); end", lambda: _commit_and_end(locks, _append(1), 13)),
        ("getLockHighWaterMark(write[acct/1])", lambda: locks.get_lock_high_water_mark(_write(1))),
        ("commit(write[acct/2], 14); end", lambda: _commit_and_end(locks, _write(2), 14)),
        (
            "getLockHighWaterMark(write[acct/1, acct/2])",
            lambda: locks.get_lock_high_water_mark(_write(1, 2)),
        ),
        ("numActiveLocks()", locks.num_active_locks),
        ("reset(20)", lambda: locks.reset(20)),
        ("getLockHighWaterMark(write[acct/1])", lambda: locks.get_lock_high_water_mark(_write(1))),
        ("getLockHighWaterMark(no locks)", lambda: locks.get_lock_high_water_mark(LockRequest([], [], []))),
    ]
    assert len(script) == len(steps)
    for step, (op, run) in zip(steps, script, strict=True):
        assert step["op"] == op, step
        assert run() == step["result"], step


def test_append_locks_conflict_at_begin_even_though_never_checked() -> None:
    locks = Locks(DEFAULT_LOCK_TABLE_SIZE, NUM_HASH_FUNCS, 0)
    assert locks.begin(_append(5))
    assert not locks.begin(_write(5))
    assert not locks.begin(_read(5))
    assert not locks.begin(_append(5))
    locks.end(_append(5))
    assert locks.begin(_append(5))


def test_read_locks_are_not_marked_in_flight() -> None:
    locks = Locks(DEFAULT_LOCK_TABLE_SIZE, NUM_HASH_FUNCS, 0)
    assert locks.begin(_read(3))
    assert locks.begin(_read(3))
    assert locks.begin(_write(3))
    assert locks.num_active_locks() == 3


_SMALL_TABLE_SIZE_FOR_NO_LOCKS = 11


def test_an_append_without_locks_never_waits_and_changes_no_slot() -> None:
    locks = Locks(_SMALL_TABLE_SIZE_FOR_NO_LOCKS, NUM_HASH_FUNCS, 2)
    assert locks.begin(_write(9))
    none = LockRequest([], [], [])
    assert locks.begin(none)  # beside an append holding a write lock
    assert locks.num_active_locks() == 2
    assert locks.get_lock_high_water_mark(none) == NO_LOCK_HIGH_WATER_MARK
    locks.commit(none, 7)
    locks.end(none)
    slots = [locks.slot_high_water_mark(slot) for slot in range(_SMALL_TABLE_SIZE_FOR_NO_LOCKS)]
    in_flight = [locks.is_in_flight(slot) for slot in range(_SMALL_TABLE_SIZE_FOR_NO_LOCKS)]
    assert slots == [2] * _SMALL_TABLE_SIZE_FOR_NO_LOCKS
    assert sum(in_flight) == len(set(lock_slots(9, _SMALL_TABLE_SIZE_FOR_NO_LOCKS)))  # the write lock's
    assert locks.num_active_locks() == 1
    assert not locks.begin(_write(9))


def test_end_after_reset_keeps_the_active_count_at_zero() -> None:
    locks = Locks(DEFAULT_LOCK_TABLE_SIZE, NUM_HASH_FUNCS, 0)
    assert locks.begin(_write(1))
    locks.reset(4)
    locks.end(_write(1))
    assert locks.num_active_locks() == 0
    assert locks.get_lock_high_water_mark(_write(1)) == 4


# A tiny table forces collisions, the case where the estimate must still never be too low.
_SMALL_TABLE_SIZE = 17
_lock_hashes = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_commits = st.lists(
    st.tuples(st.lists(_lock_hashes, max_size=3), st.lists(_lock_hashes, max_size=3)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(commits=_commits, probe=_lock_hashes)
def test_estimate_is_never_below_the_true_lock_high_water_mark(
    commits: list[tuple[list[int], list[int]]], probe: int
) -> None:
    initial_high_water_mark = -1
    locks = Locks(_SMALL_TABLE_SIZE, NUM_HASH_FUNCS, initial_high_water_mark)
    last_commit: dict[int, int] = {}
    slot_model = [initial_high_water_mark] * _SMALL_TABLE_SIZE
    for transaction_id, (write_locks, append_locks) in enumerate(commits):
        request = LockRequest(write_locks, [], append_locks)
        assert locks.begin(request)
        locks.commit(request, transaction_id)
        locks.end(request)
        for lock_hash in write_locks + append_locks:
            last_commit[lock_hash] = transaction_id
            for slot in lock_slots(lock_hash, _SMALL_TABLE_SIZE):
                slot_model[slot] = transaction_id
        assert locks.num_active_locks() == 0
    true_high_water_mark = last_commit.get(probe, initial_high_water_mark)
    estimate = min(slot_model[slot] for slot in lock_slots(probe, _SMALL_TABLE_SIZE))
    assert estimate >= true_high_water_mark
    assert locks.get_lock_high_water_mark(LockRequest([probe], [], [])) == estimate
    assert locks.get_lock_high_water_mark(LockRequest([], [probe], [])) == estimate


@settings(max_examples=200, deadline=None)
@given(first=st.lists(_lock_hashes, max_size=4), second=st.lists(_lock_hashes, max_size=4))
def test_begin_refuses_exactly_when_slots_overlap(first: list[int], second: list[int]) -> None:
    locks = Locks(_SMALL_TABLE_SIZE, NUM_HASH_FUNCS, 0)
    assert locks.begin(LockRequest(first, [], []))
    first_slots = {slot for h in first for slot in lock_slots(h, _SMALL_TABLE_SIZE)}
    second_slots = {slot for h in second for slot in lock_slots(h, _SMALL_TABLE_SIZE)}
    expected = not (first_slots & second_slots)
    assert locks.begin(LockRequest([], second, [])) == expected
    assert locks.get_lock_high_water_mark(LockRequest([], [], second)) == NO_LOCK_HIGH_WATER_MARK
