"""The server's caches are bounded by configuration, but hold memory only as they fill: a server
that starts with the default 128 MB transaction cache and 64 MB feed cache is not 190 MB resident
before its first transaction (common/zeroed.py)."""

from __future__ import annotations

import os

from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feed_cache import DEFAULT_FEED_CACHE_SIZE_BYTES, FeedCache
from waltz_engine.server.transaction_cache import DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES, TransactionCache

# Far below what either cache would take if its memory were written up front.
MAX_GROWTH_BYTES = 16 * 1024 * 1024


def resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_new_transaction_cache_is_not_resident() -> None:
    before = resident_bytes()
    cache = TransactionCache(DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES)
    assert resident_bytes() - before < MAX_GROWTH_BYTES
    assert cache.put(3, 7, b"data", 42)
    assert cache.get(3, 7) == (b"data", 42)


def test_a_new_feed_cache_is_not_resident() -> None:
    before = resident_bytes()
    cache = FeedCache(DEFAULT_FEED_CACHE_SIZE_BYTES)
    assert resident_bytes() - before < MAX_GROWTH_BYTES
    cache.add(3, 7, ReqId(1, 2, 3, 4), 9)
    assert cache.get(3, 7) == (ReqId(1, 2, 3, 4), 9)
