"""Transaction data cache (§2.5): ring buffer, wrap-around, size bound, shared fetches."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.server.transaction_cache import (
    ENTRY_OVERHEAD_SIZE_BYTES,
    TransactionCache,
    TransactionData,
    TransactionFetcher,
    entry_size_bytes,
)


def _data(partition_id: int, transaction_id: int, size_bytes: int) -> bytes:
    return bytes((partition_id * 31 + transaction_id + i) & 0xFF for i in range(size_bytes))


def _checksum(partition_id: int, transaction_id: int) -> int:
    return (partition_id * 1_000_003 + transaction_id * 7_919) % 2**32 - 2**31


def test_put_then_get_round_trips_and_misses_are_metered() -> None:
    metrics = MetricsRegistry()
    cache = TransactionCache(4096, metrics)
    assert cache.put(2, 9, b"hello", -5)
    assert cache.get(2, 9) == (b"hello", -5)
    assert cache.get(2, 10) is None
    assert cache.get(3, 9) is None
    assert metrics.meter("waltz-server", "transaction-cache-miss").count == 2


def test_entries_are_laid_out_as_the_original_writes_them() -> None:
    cache = TransactionCache(4096)
    cache.put(1, 2**40, b"\x01\x02\x03", -2)
    cache.put(1, 7, b"", 3)
    layout = struct.pack(">iqi3si", 1, 2**40, 3, b"\x01\x02\x03", -2) + struct.pack(">iqii", 1, 7, 0, 3)
    assert bytes(cache._buffer[: len(layout)]) == layout


def test_an_entry_over_a_quarter_of_the_cache_is_not_cached() -> None:
    size_bytes = 4000
    cache = TransactionCache(size_bytes)
    largest = size_bytes // 4 - ENTRY_OVERHEAD_SIZE_BYTES
    assert not cache.put(0, 1, bytes(largest + 1), 0)
    assert cache.get(0, 1) is None
    assert cache.num_entries() == 0
    assert cache.put(0, 2, bytes(largest), 0)
    assert cache.get(0, 2) == (bytes(largest), 0)


def test_a_cache_too_small_for_any_entry_caches_nothing() -> None:
    cache = TransactionCache(4 * ENTRY_OVERHEAD_SIZE_BYTES - 1)
    assert not cache.put(0, 0, b"", 0)
    assert cache.get(0, 0) is None


def test_an_entry_ending_exactly_at_the_ring_end_is_reclaimed_in_turn() -> None:
    # Five empty-data entries fill a 100-byte ring exactly; the next five replace them in order.
    entries_per_ring = 5
    cache = TransactionCache(entries_per_ring * ENTRY_OVERHEAD_SIZE_BYTES)
    for transaction_id in range(2 * entries_per_ring):
        assert cache.put(0, transaction_id, b"", transaction_id)
    assert [cache.get(0, t) for t in range(2 * entries_per_ring)] == [None] * entries_per_ring + [
        (b"", t) for t in range(entries_per_ring, 2 * entries_per_ring)
    ]
    assert cache.num_entries() == entries_per_ring


def test_filling_many_times_over_keeps_memory_bounded() -> None:
    size_bytes = 10_000
    cache = TransactionCache(size_bytes)
    for transaction_id in range(5_000):
        assert cache.put(transaction_id % 3, transaction_id, _data(0, transaction_id, transaction_id % 97), 0)
        assert len(cache._buffer) == size_bytes
        assert cache.num_entries() <= size_bytes // ENTRY_OVERHEAD_SIZE_BYTES
    assert cache.get(4_999 % 3, 4_999) == (_data(0, 4_999, 4_999 % 97), 0)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), st.integers(0, 40), st.integers(0, 120)),
        st.tuples(st.just("remove"), st.integers(0, 2), st.just(0), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(size_bytes=st.integers(80, 800), ops=_ops)
def test_wrap_around_keeps_the_newest_writes(size_bytes: int, ops: list[tuple[str, int, int, int]]) -> None:
    """Model: the log of writes into the ring. What is found is correct, fits the ring, is a suffix
    of the still-current writes (FIFO eviction), and includes every write of the newest half ring."""
    cache = TransactionCache(size_bytes)
    ring_log: list[tuple[int, int, int]] = []  # (partition, txid, entry size) per write, oldest first
    removed_before: dict[int, int] = {}  # partition -> writes before its last removal
    expected: dict[tuple[int, int], TransactionData] = {}
    for op, partition_id, transaction_id, data_size_bytes in ops:
        if op == "remove":
            cache.remove_partition(partition_id)
            removed_before[partition_id] = len(ring_log)
            continue
        data = _data(partition_id, transaction_id, data_size_bytes)
        checksum = _checksum(partition_id, transaction_id)
        was_cached = cache.get(partition_id, transaction_id) is not None
        accepted = cache.put(partition_id, transaction_id, data, checksum)
        assert accepted == (entry_size_bytes(data_size_bytes) <= size_bytes // 4)
        if accepted and not was_cached:
            ring_log.append((partition_id, transaction_id, entry_size_bytes(data_size_bytes)))
            expected[(partition_id, transaction_id)] = (data, checksum)

        last_write = {(p, t): i for i, (p, t, _) in enumerate(ring_log)}
        current = [
            i
            for i, (p, t, _) in enumerate(ring_log)
            if last_write[(p, t)] == i and i >= removed_before.get(p, 0)
        ]
        found = [cache.get(ring_log[i][0], ring_log[i][1]) is not None for i in current]
        for i, is_found in zip(current, found, strict=True):
            if is_found:
                assert cache.get(ring_log[i][0], ring_log[i][1]) == expected[ring_log[i][:2]]
        assert sum(ring_log[i][2] for i, f in zip(current, found, strict=True) if f) <= size_bytes
        assert found == sorted(found), "evicted out of write order"
        newest_bytes = 0
        for i in range(len(ring_log) - 1, -1, -1):
            newest_bytes += ring_log[i][2]
            if newest_bytes > size_bytes // 2:
                break
            if i in current:
                assert found[current.index(i)], ("newest half ring lost", i, ring_log[i])
        if accepted:
            assert cache.get(partition_id, transaction_id) == expected[(partition_id, transaction_id)]


def test_concurrent_fetches_of_one_key_share_one_load() -> None:
    async def scenario() -> None:
        fetcher = TransactionFetcher(TransactionCache(4096))
        release = asyncio.Event()
        loads = 0

        async def load() -> TransactionData:
            nonlocal loads
            loads += 1
            await release.wait()
            return b"payload", 42

        waiters = [asyncio.create_task(fetcher.fetch(0, 5, load)) for _ in range(5)]
        await asyncio.sleep(0)
        assert fetcher.num_loading() == 1
        release.set()
        assert await asyncio.gather(*waiters) == [(b"payload", 42)] * 5
        assert loads == 1
        assert fetcher.num_loading() == 0
        # Now cached: served without loading.
        assert await fetcher.fetch(0, 5, load) == (b"payload", 42)
        assert loads == 1

    asyncio.run(scenario())


def test_a_failed_load_fails_every_waiter_once_and_is_retried_later() -> None:
    async def scenario() -> None:
        fetcher = TransactionFetcher(TransactionCache(4096))
        release = asyncio.Event()
        attempts = 0

        async def load() -> TransactionData:
            nonlocal attempts
            attempts += 1
            await release.wait()
            if attempts == 1:
                raise LookupError("transaction not found")
            return b"late", 1

        waiters = [asyncio.create_task(fetcher.fetch(1, 8, load)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(result, LookupError) for result in results)
        assert await fetcher.fetch(1, 8, load) == (b"late", 1)
        assert attempts == 2

    asyncio.run(scenario())


def test_a_cancelled_waiter_does_not_cancel_the_shared_load() -> None:
    async def scenario() -> None:
        fetcher = TransactionFetcher(TransactionCache(4096))
        release = asyncio.Event()

        async def load() -> TransactionData:
            await release.wait()
            return b"kept", 3

        first = asyncio.create_task(fetcher.fetch(2, 1, load))
        second = asyncio.create_task(fetcher.fetch(2, 1, load))
        await asyncio.sleep(0)
        first.cancel()
        release.set()
        assert await second == (b"kept", 3)
        with pytest.raises(asyncio.CancelledError):
            await first
        assert fetcher.cache.get(2, 1) == (b"kept", 3)

    asyncio.run(scenario())
