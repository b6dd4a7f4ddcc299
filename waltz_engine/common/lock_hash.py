"""The int32 a client puts in the lock arrays of APPEND_REQUEST (reference §2.6, §3.1).

The original's ``PartitionLocalLock(name, id).hashCode()`` is ``name.hashCode() ^ Long.hashCode(id)``;
the server only ever sees this hash, so two locks with equal hashes are the same lock to it.
"""

from __future__ import annotations

from waltz_engine.zk.java_io import INT64_MAX, INT64_MIN, java_string_hash, to_int32

_MASK64 = 0xFFFFFFFFFFFFFFFF


def java_long_hash(value: int) -> int:
    """``Long.hashCode(v)`` = ``(int)(v ^ (v >>> 32))``."""
    assert INT64_MIN <= value <= INT64_MAX, value
    unsigned = value & _MASK64
    return to_int32(unsigned ^ (unsigned >> 32))


def partition_local_lock_hash(name: str, lock_id: int) -> int:
    """``PartitionLocalLock(name, lock_id).hashCode()``: the lock as the server sees it."""
    return to_int32(java_string_hash(name) ^ java_long_hash(lock_id))
