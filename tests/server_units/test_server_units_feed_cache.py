"""Feed cache (§2.5): blocks of 64 txns, two-level pools, quota, bounded memory."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feed_cache import (
    DEFAULT_FEED_CACHE_SIZE_BYTES,
    FEED_CACHE_BLOCK_NUM_TRANSACTIONS,
    FEED_CACHE_BLOCK_SIZE_BYTES,
    MAX_PARTITION_BLOCKS,
    MIN_PARTITION_BLOCKS,
    FeedCache,
    partition_quota_blocks,
)

BLOCK = FEED_CACHE_BLOCK_NUM_TRANSACTIONS


def _req_id(partition_id: int, transaction_id: int) -> ReqId:
    # Negative fields exercise the signed 64-bit packing of the two reqId words.
    return ReqId(-transaction_id - 1, 7, partition_id, -(2**31) + transaction_id)


def _header(transaction_id: int) -> int:
    return (transaction_id * 2_654_435_761) % 2**32 - 2**31


def _cache_of_blocks(num_blocks: int, metrics: MetricsRegistry | None = None) -> FeedCache:
    return FeedCache(num_blocks * FEED_CACHE_BLOCK_SIZE_BYTES + FEED_CACHE_BLOCK_SIZE_BYTES - 1, metrics)


def _add(cache: FeedCache, partition_id: int, transaction_id: int) -> None:
    cache.add(partition_id, transaction_id, _req_id(partition_id, transaction_id), _header(transaction_id))


def _expected(partition_id: int, transaction_id: int) -> tuple[ReqId, int]:
    return _req_id(partition_id, transaction_id), _header(transaction_id)


def test_block_count_and_quota_follow_the_original() -> None:
    assert DEFAULT_FEED_CACHE_SIZE_BYTES // FEED_CACHE_BLOCK_SIZE_BYTES == 51_306
    assert partition_quota_blocks(51_306, 1) == MAX_PARTITION_BLOCKS
    assert partition_quota_blocks(51_306, 9) == 5_130
    assert partition_quota_blocks(10, 9) == MIN_PARTITION_BLOCKS
    assert _cache_of_blocks(5).total_blocks == 5


def test_add_then_get_round_trips_reqid_and_header() -> None:
    cache = _cache_of_blocks(4)
    for transaction_id in range(3 * BLOCK):
        _add(cache, 0, transaction_id)
    for transaction_id in range(3 * BLOCK):
        assert cache.get(0, transaction_id) == _expected(0, transaction_id)
    cache.check_invariants()


def test_misses_are_metered_and_partitions_do_not_see_each_other() -> None:
    metrics = MetricsRegistry()
    cache = _cache_of_blocks(8, metrics)
    _add(cache, 1, 5)
    assert cache.get(2, 5) is None
    assert cache.get(1, 6) is None
    assert cache.get(1, 5) == _expected(1, 5)
    assert metrics.meter("waltz-server", "feed-cache-miss").count == 2


def test_prefetch_range_stops_at_the_last_missing_id_of_the_block() -> None:
    cache = _cache_of_blocks(4)
    assert cache.prefetch_range(0, BLOCK + 10) == range(BLOCK + 10, 2 * BLOCK)
    cache.add_all(0, [RecordHeader(t, _req_id(0, t), 0) for t in range(BLOCK + 40, 2 * BLOCK)])
    assert cache.prefetch_range(0, BLOCK + 10) == range(BLOCK + 10, BLOCK + 40)
    cache.add_all(0, [RecordHeader(t, _req_id(0, t), 0) for t in range(BLOCK + 10, BLOCK + 40)])
    assert cache.prefetch_range(0, BLOCK + 10) == range(BLOCK + 10, BLOCK + 10)


def test_blocks_evicted_from_a_local_pool_get_a_second_chance() -> None:
    # 6 blocks, one partition: quota 3; the shared pool keeps evicted blocks valid.
    cache = _cache_of_blocks(6)
    for transaction_id in range(5 * BLOCK):
        _add(cache, 0, transaction_id)
    assert cache.quota_blocks() == 3
    assert cache.num_blocks(0) == 3
    assert cache.num_shared_blocks() == 2
    assert cache.get(0, 0) == _expected(0, 0)
    assert cache.num_blocks(0) == 3
    cache.check_invariants()


def test_adding_far_more_than_fits_never_exceeds_the_configured_blocks() -> None:
    total_blocks = 7
    cache = _cache_of_blocks(total_blocks)
    num_partitions = 3
    for transaction_id in range(0, 200 * BLOCK, 5):
        for partition_id in range(num_partitions):
            _add(cache, partition_id, transaction_id)
        held = sum(cache.num_blocks(p) for p in range(num_partitions))
        assert held + cache.num_shared_blocks() + cache.num_free_blocks() == total_blocks
        assert all(cache.num_blocks(p) <= cache.quota_blocks() for p in range(num_partitions))
    cache.check_invariants()
    last = 200 * BLOCK - 5
    assert all(cache.get(p, last) == _expected(p, last) for p in range(num_partitions))


def test_an_exhausted_pool_recycles_blocks_instead_of_blocking() -> None:
    # 3 blocks but quota 2 for each of 3 partitions: more demand than blocks.
    cache = _cache_of_blocks(3)
    for partition_id in range(3):
        for transaction_id in range(4 * BLOCK):
            _add(cache, partition_id, transaction_id)
            cache.check_invariants()
    assert cache.quota_blocks() == MIN_PARTITION_BLOCKS
    last = 4 * BLOCK - 1
    assert all(cache.get(p, last) == _expected(p, last) for p in range(3))
    # A 4th partition finds every block some partition's frontier: it caches nothing, harmlessly.
    _add(cache, 3, last)
    assert cache.get(3, last) is None
    assert all(cache.get(p, last) == _expected(p, last) for p in range(3))
    cache.check_invariants()


def test_a_recycled_block_forgets_what_it_held() -> None:
    cache = _cache_of_blocks(2)
    for transaction_id in range(2 * BLOCK):
        _add(cache, 0, transaction_id)
    _add(cache, 0, 2 * BLOCK)  # recycles the block of txns 0..63
    assert cache.get(0, 0) is None
    assert cache.get(0, 2 * BLOCK + 1) is None
    assert cache.get(0, 2 * BLOCK) == _expected(0, 2 * BLOCK)


def test_a_cache_smaller_than_a_block_caches_nothing() -> None:
    cache = FeedCache(FEED_CACHE_BLOCK_SIZE_BYTES - 1)
    _add(cache, 0, 1)
    assert cache.get(0, 1) is None
    cache.check_invariants()


def test_remove_partition_frees_its_blocks_and_widens_the_others_quota() -> None:
    cache = _cache_of_blocks(9)
    for transaction_id in range(6 * BLOCK):
        _add(cache, 0, transaction_id)
        _add(cache, 1, transaction_id)
    assert cache.quota_blocks() == 3
    cache.remove_partition(1)
    assert cache.num_blocks(1) == 0
    assert cache.get(1, 6 * BLOCK - 1) is None
    assert cache.quota_blocks() == 4
    assert cache.num_free_blocks() >= 3
    cache.check_invariants()
    # Served again later, the partition finds none of its old blocks (not even shared ones).
    _add(cache, 1, 10 * BLOCK)
    assert all(cache.get(1, t) is None for t in range(0, 6 * BLOCK, BLOCK))


_ops = st.lists(
    st.tuples(st.sampled_from(["add", "get", "remove"]), st.integers(0, 3), st.integers(0, 12 * BLOCK)),
    max_size=300,
)


# With 4 partitions, 8 blocks cover every quota, so then an add can always take a block.
_BLOCKS_FOR_EVERY_QUOTA = 4 * MIN_PARTITION_BLOCKS


@settings(max_examples=100, deadline=None)
@given(num_blocks=st.integers(0, 12), ops=_ops)
def test_random_traffic_never_returns_wrong_data(num_blocks: int, ops: list[tuple[str, int, int]]) -> None:
    cache = _cache_of_blocks(num_blocks)
    added: dict[int, set[int]] = {}
    last_cached: dict[int, int] = {}
    for op, partition_id, transaction_id in ops:
        if op == "add":
            _add(cache, partition_id, transaction_id)
            added.setdefault(partition_id, set()).add(transaction_id)
            last_cached.pop(partition_id, None)
            if cache.get(partition_id, transaction_id) is not None:
                last_cached[partition_id] = transaction_id
            else:
                assert num_blocks < _BLOCKS_FOR_EVERY_QUOTA
        elif op == "get":
            got = cache.get(partition_id, transaction_id)
            if got is not None:
                assert transaction_id in added.get(partition_id, set())
                assert got == _expected(partition_id, transaction_id)
        else:
            cache.remove_partition(partition_id)
            added.pop(partition_id, None)
            last_cached.pop(partition_id, None)
        cache.check_invariants()
        # The frontier (the block add wrote last) is never evicted while its partition lives.
        for p, t in last_cached.items():
            assert cache.get(p, t) == _expected(p, t)
