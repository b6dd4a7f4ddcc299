"""The per-partition optimistic lock table (reference §2.6; the original's ``Locks``).

Like a Bloom filter: every lock hash picks ``num_hash_funcs`` slots, each slot holds the highest
transaction id committed under any lock mapped to it, and a lock's high-water mark is the minimum
over its slots. Collisions can only raise that estimate, so a conflict is never missed (false
positives, never false negatives). A bitset marks the write and append slots of appends in
flight, and no append begins while any slot of any of its locks is marked, so an append never
checks or overwrites a lock another append in flight is about to commit.

Lock kinds (PR #77): write = checked and committed; read = checked only; append = committed only.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import NamedTuple

from waltz_engine.wire.client_messages import NO_LOCKS, AppendRequest
from waltz_engine.zk.java_io import INT64_MAX, to_int32

# server.optimisticLockTableSize default and the hash count Partition.AppendTask.init passes.
DEFAULT_LOCK_TABLE_SIZE = 30_000
NUM_HASH_FUNCS = 3

# The slot sequence is the C library LCG, computed in Java int (32-bit wrap-around).
LCG_MULTIPLIER = 1_103_515_245
LCG_INCREMENT = 12_345
SLOT_HASH_MASK = 0x3FFFFFFF  # drops the sign bit (and one more) before the modulo
_MASK32 = 0xFFFFFFFF

# A lock table's high-water mark when a request has no checked (write or read) lock.
NO_LOCK_HIGH_WATER_MARK = -1

_NO_SLOTS: list[int] = []  # shared and never mutated: most requests lack some lock kind


class LockRequest(NamedTuple):
    """The three lock-hash arrays of one APPEND_REQUEST."""

    write_locks: Sequence[int]
    read_locks: Sequence[int]
    append_locks: Sequence[int]


# The lock request of an append without locks (most appends): one object, so that the partition
# skips the table's calls that do nothing for it (``is NO_LOCK_REQUEST``).
NO_LOCK_REQUEST = LockRequest(NO_LOCKS, NO_LOCKS, NO_LOCKS)


def lock_request(request: AppendRequest) -> LockRequest:
    """The locks an APPEND_REQUEST asks for."""
    write_locks = request.write_lock_request
    read_locks = request.read_lock_request
    append_locks = request.append_lock_request
    if not (write_locks or read_locks or append_locks):
        return NO_LOCK_REQUEST
    return LockRequest(write_locks or NO_LOCKS, read_locks or NO_LOCKS, append_locks or NO_LOCKS)


# Passed as the table size to get the LCG states themselves rather than slots.
_RAW_STATES = 0


def _lcg_walk(lock_hashes: Sequence[int], num_hash_funcs: int, table_size: int) -> list[int]:
    """The slots of every lock in turn, ``num_hash_funcs`` per lock (may repeat); with
    ``_RAW_STATES``, the LCG states (unsigned 32-bit) instead.

    Unsigned is enough: masking with SLOT_HASH_MASK gives the same bits as Java's signed int.
    One loop for both so the formula exists once; the hot path is the slots.
    """
    walk: list[int] = []
    for lock_hash in lock_hashes:
        state = lock_hash & _MASK32
        for _ in range(num_hash_funcs):
            state = (state * LCG_MULTIPLIER + LCG_INCREMENT) & _MASK32
            walk.append((state & SLOT_HASH_MASK) % table_size if table_size else state)
    return walk


def lock_hash_chain(lock_hash: int, num_hash_funcs: int = NUM_HASH_FUNCS) -> list[int]:
    """The LCG values (Java int) the table derives from one lock hash, in order."""
    return [to_int32(state) for state in _lcg_walk((lock_hash,), num_hash_funcs, _RAW_STATES)]


def lock_slots(
    lock_hash: int, table_size: int = DEFAULT_LOCK_TABLE_SIZE, num_hash_funcs: int = NUM_HASH_FUNCS
) -> list[int]:
    """The table slots one lock hash maps to, in order (may repeat)."""
    assert table_size > 0, table_size
    return _lcg_walk((lock_hash,), num_hash_funcs, table_size)


class Locks:
    """One partition's lock table. Memory: 8 bytes + 1 bit per slot, fixed at construction.

    Not thread-safe: the partition's append path is its only user.
    """

    __slots__ = ("_size", "_num_hash_funcs", "_high_water_marks", "_in_flight", "_num_active_requests")

    def __init__(self, size: int, num_hash_funcs: int, high_water_mark: int) -> None:
        assert size > 0, size
        assert num_hash_funcs > 0, num_hash_funcs
        self._size = size
        self._num_hash_funcs = num_hash_funcs
        self._high_water_marks = array("q", [high_water_mark]) * size
        self._in_flight = bytearray((size + 7) >> 3)
        self._num_active_requests = 0

    @property
    def size(self) -> int:
        return self._size

    def _slots(self, lock_hashes: Sequence[int]) -> list[int]:
        return _lcg_walk(lock_hashes, self._num_hash_funcs, self._size) if lock_hashes else _NO_SLOTS

    def _any_in_flight(self, slots: list[int]) -> bool:
        in_flight = self._in_flight
        for slot in slots:  # noqa: SIM110 - a plain loop: no generator per call on the append path
            if in_flight[slot >> 3] & (1 << (slot & 7)):
                return True
        return False

    def _mark(self, slots: list[int]) -> None:
        in_flight = self._in_flight
        for slot in slots:
            in_flight[slot >> 3] |= 1 << (slot & 7)

    def _unmark(self, slots: list[int]) -> None:
        in_flight = self._in_flight
        for slot in slots:
            in_flight[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF

    def begin(self, request: LockRequest) -> bool:
        """Marks the write and append slots in flight, unless any slot of any lock already is."""
        if not (request.write_locks or request.read_locks or request.append_locks):
            # No lock at all (most appends): nothing to mark or check.
            self._num_active_requests += 1
            return True
        write_slots = self._slots(request.write_locks)
        append_slots = self._slots(request.append_locks)
        if (
            self._any_in_flight(write_slots)
            or self._any_in_flight(self._slots(request.read_locks))
            or self._any_in_flight(append_slots)
        ):
            return False
        self._mark(write_slots)
        self._mark(append_slots)
        self._num_active_requests += 1
        return True

    def end(self, request: LockRequest) -> None:
        """Unmarks what ``begin`` marked, whether or not the append committed."""
        if request.write_locks or request.append_locks:
            self._unmark(self._slots(request.write_locks))
            self._unmark(self._slots(request.append_locks))
        # An append begun before a reset may end after it; the original's count then goes
        # negative, which only distorts a log line, so the count stops at zero instead.
        self._num_active_requests = max(0, self._num_active_requests - 1)

    def _max_of_min(self, lock_hashes: Sequence[int], highest: int) -> int:
        high_water_marks = self._high_water_marks
        num_hash_funcs = self._num_hash_funcs
        lowest = INT64_MAX
        remaining = num_hash_funcs  # slots of the current lock still to see
        for slot in self._slots(lock_hashes):
            lowest = min(lowest, high_water_marks[slot])
            remaining -= 1
            if remaining == 0:
                highest = max(highest, lowest)
                lowest = INT64_MAX
                remaining = num_hash_funcs
        return highest

    def get_lock_high_water_mark(self, request: LockRequest) -> int:
        """Estimated last txid committed under the checked locks: max over locks of min over slots.

        Never below the true value; NO_LOCK_HIGH_WATER_MARK without write or read locks.
        """
        if not (request.write_locks or request.read_locks):
            return NO_LOCK_HIGH_WATER_MARK
        high_water_mark = self._max_of_min(request.write_locks, NO_LOCK_HIGH_WATER_MARK)
        return self._max_of_min(request.read_locks, high_water_mark)

    def commit(self, request: LockRequest, transaction_id: int) -> None:
        """Records ``transaction_id`` in every slot of the write and append locks."""
        if not (request.write_locks or request.append_locks):
            return
        high_water_marks = self._high_water_marks
        for slot in self._slots(request.write_locks):
            high_water_marks[slot] = transaction_id
        for slot in self._slots(request.append_locks):
            high_water_marks[slot] = transaction_id

    def may_have_committed(self, request: LockRequest, transaction_id: int) -> None:
        """As :meth:`commit`, for an append that may or may not have committed at
        ``transaction_id`` (its outcome unknowable): a slot only rises, since it may hold a later
        commit already. A false conflict costs a retry; a missed one, a lost update."""
        high_water_marks = self._high_water_marks
        for slot in [*self._slots(request.write_locks), *self._slots(request.append_locks)]:
            high_water_marks[slot] = max(high_water_marks[slot], transaction_id)

    def reset(self, high_water_mark: int) -> None:
        """Forgets every lock: all slots back to ``high_water_mark``, nothing in flight."""
        self._high_water_marks[:] = array("q", [high_water_mark]) * self._size
        self._in_flight[:] = bytes(len(self._in_flight))
        self._num_active_requests = 0

    def num_active_locks(self) -> int:
        """Requests between ``begin`` and ``end`` (the original's ``numActiveLocks``)."""
        return self._num_active_requests

    def is_in_flight(self, slot: int) -> bool:
        assert 0 <= slot < self._size, slot
        return bool(self._in_flight[slot >> 3] & (1 << (slot & 7)))

    def slot_high_water_mark(self, slot: int) -> int:
        return self._high_water_marks[slot]
