"""The feed cache: (reqId, header) of recent transactions, so feeds rarely ask storage (§2.5).

As the original's ``FeedCache``/``FeedCachePartition``/``FeedCacheBlock``: transactions are cached in
blocks of 64 consecutive ids (``txid & ~63``); the number of blocks is fixed by
``feed_cache_size_bytes // 1308`` and every block lives in flat arrays allocated up front, so memory
never exceeds that bound (their pages are mapped as they are first written: ``common/zeroed.py``).
Blocks move between two FIFO levels:

* a partition's local pool, at most ``clamp(total_blocks // (num_partitions + 1), 2, 10000)``
  blocks; the block ``add`` last wrote to (the frontier) is never evicted from it;
* the shared pool of blocks evicted from local pools. They stay valid there, so a partition can
  take one back (second chance); checking out a new block recycles a free block first, then the
  oldest shared one.

Where the original blocks a thread until another partition checks a block in (which only happens
when the quotas, at least 2 blocks each, overcommit the blocks), single-threaded asyncio cannot
wait: the partition recycles its own oldest block instead, or if it holds none, the oldest block of
the largest pool that is not that pool's frontier; failing that the transaction is simply not
cached (a later feed reads it from storage).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable

from waltz_engine.common.metrics import Meter, MetricsRegistry
from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.common.zeroed import zeroed_array

DEFAULT_FEED_CACHE_SIZE_BYTES = 64 * 1024 * 1024

FEED_CACHE_BLOCK_NUM_TRANSACTIONS = 64
FEED_CACHE_BLOCK_INDEX_MASK = FEED_CACHE_BLOCK_NUM_TRANSACTIONS - 1
_BLOCK_USAGE_FULL = (1 << FEED_CACHE_BLOCK_NUM_TRANSACTIONS) - 1
# Accounted as the original does: first txid + usage mask + 64 x (reqId 16 + header 4), plus the
# block key (partition id 4 + first txid 8). The arrays below hold exactly the first part.
FEED_CACHE_BLOCK_DATA_SIZE_BYTES = 8 + 8 + FEED_CACHE_BLOCK_NUM_TRANSACTIONS * (16 + 4)
FEED_CACHE_BLOCK_KEY_SIZE_BYTES = 4 + 8
FEED_CACHE_BLOCK_SIZE_BYTES = FEED_CACHE_BLOCK_DATA_SIZE_BYTES + FEED_CACHE_BLOCK_KEY_SIZE_BYTES
assert FEED_CACHE_BLOCK_SIZE_BYTES == 1308

MIN_PARTITION_BLOCKS = 2
MAX_PARTITION_BLOCKS = 10_000

METRIC_GROUP = "waltz-server"
FEED_CACHE_MISS_METER = "feed-cache-miss"

_NO_BLOCK = -1
# A ReqId's four int fields, read back as its two longs (msb, lsb), big-endian as on the wire.
_REQ_ID_INTS = struct.Struct(">iiii")
_REQ_ID_LONGS = struct.Struct(">qq")


def block_first_transaction_id(transaction_id: int) -> int:
    return transaction_id & ~FEED_CACHE_BLOCK_INDEX_MASK


def partition_quota_blocks(total_blocks: int, num_partitions: int) -> int:
    """Local pool size of each partition: a share that leaves one share in the shared pool."""
    share = total_blocks // (num_partitions + 1)
    return min(max(share, MIN_PARTITION_BLOCKS), MAX_PARTITION_BLOCKS)


class _LocalPool:
    __slots__ = ("partition_id", "blocks", "frontier", "quota_blocks")

    def __init__(self, partition_id: int, quota_blocks: int) -> None:
        self.partition_id = partition_id
        # first txid -> block number, oldest first (dicts keep insertion order).
        self.blocks: dict[int, int] = {}
        self.frontier = _NO_BLOCK
        self.quota_blocks = quota_blocks


class FeedCache:
    """Shared by every partition of a server. Not thread-safe: one event loop owns it."""

    __slots__ = (
        "total_blocks",
        "_req_id_msb",
        "_req_id_lsb",
        "_headers",
        "_usage",
        "_first_transaction_id",
        "_free",
        "_next_unused",
        "_shared",
        "_partitions",
        "_miss_meter",
    )

    def __init__(self, feed_cache_size_bytes: int, metrics: MetricsRegistry | None = None) -> None:
        assert feed_cache_size_bytes >= 0, feed_cache_size_bytes
        total_blocks = feed_cache_size_bytes // FEED_CACHE_BLOCK_SIZE_BYTES
        num_entries = total_blocks * FEED_CACHE_BLOCK_NUM_TRANSACTIONS
        self.total_blocks = total_blocks
        self._req_id_msb = zeroed_array("q", num_entries)
        self._req_id_lsb = zeroed_array("q", num_entries)
        self._headers = zeroed_array("i", num_entries)
        self._usage = zeroed_array("Q", total_blocks)
        self._first_transaction_id = zeroed_array("q", total_blocks)
        # Free blocks are recycled before any valid one: freed ones popped from the end, then
        # the ones never used, from block 0 up (counted, not listed: a list of every block cost
        # a server's start ~10 ms of Python ints).
        self._free = array("i")
        self._next_unused = 0
        # (partition id, first txid) -> block number, oldest first.
        self._shared: dict[tuple[int, int], int] = {}
        self._partitions: dict[int, _LocalPool] = {}
        self._miss_meter: Meter | None = (
            metrics.meter(METRIC_GROUP, FEED_CACHE_MISS_METER) if metrics is not None else None
        )

    # --- public API ----------------------------------------------------------------------

    def add(self, partition_id: int, transaction_id: int, req_id: ReqId, header: int) -> None:
        """Caches a committed transaction's feed data."""
        assert transaction_id >= 0, transaction_id
        # (Every commit of a server comes here: the known pool and the block's first txid inline.)
        pool = self._partitions.get(partition_id)
        if pool is None:
            pool = self._pool(partition_id)
        first = transaction_id & ~FEED_CACHE_BLOCK_INDEX_MASK  # block_first_transaction_id
        block = pool.frontier
        if block == _NO_BLOCK or self._first_transaction_id[block] != first:
            block = self._local_block(partition_id, pool, first, create=True)
            if block == _NO_BLOCK:
                return
            pool.frontier = block
        self._write(block, transaction_id, req_id, header)

    def add_all(self, partition_id: int, record_headers: Iterable[RecordHeader]) -> None:
        """Caches the answer to a RECORD_HEADER_LIST prefetch."""
        pool = self._pool(partition_id)
        block = _NO_BLOCK
        first = -1
        for transaction_id, req_id, header in record_headers:
            assert transaction_id >= 0, transaction_id
            if block == _NO_BLOCK or block_first_transaction_id(transaction_id) != first:
                first = block_first_transaction_id(transaction_id)
                block = self._local_block(partition_id, pool, first, create=True)
                if block == _NO_BLOCK:
                    return
            self._write(block, transaction_id, req_id, header)

    def get(self, partition_id: int, transaction_id: int) -> tuple[ReqId, int] | None:
        """(reqId, header) of a cached transaction; None (and a miss marked) otherwise.

        Unlike the original, a miss checks out no empty block: ``add_all`` does once the
        prefetch answers, so a failed prefetch costs no cached block.
        """
        pool = self._partitions.get(partition_id)
        if pool is not None:
            first = block_first_transaction_id(transaction_id)
            block = pool.frontier
            if block == _NO_BLOCK or self._first_transaction_id[block] != first:
                block = self._local_block(partition_id, pool, first, create=False)
            index = transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
            if block != _NO_BLOCK and (self._usage[block] >> index) & 1:
                entry = block * FEED_CACHE_BLOCK_NUM_TRANSACTIONS + index
                return ReqId.from_bits(self._req_id_msb[entry], self._req_id_lsb[entry]), self._headers[entry]
        if self._miss_meter is not None:
            self._miss_meter.mark()
        return None

    def prefetch_range(self, partition_id: int, transaction_id: int) -> range:
        """Transaction ids to ask storage for after a miss: from ``transaction_id`` up to the last
        id of its block not cached yet (the original always asks up to the block's end)."""
        first = block_first_transaction_id(transaction_id)
        end = first + FEED_CACHE_BLOCK_NUM_TRANSACTIONS
        block = self._find_block(partition_id, first)
        if block != _NO_BLOCK:
            at_or_after = _BLOCK_USAGE_FULL & ~((1 << (transaction_id & FEED_CACHE_BLOCK_INDEX_MASK)) - 1)
            missing = ~self._usage[block] & at_or_after
            end = first + missing.bit_length() if missing else transaction_id
        return range(transaction_id, end)

    def remove_partition(self, partition_id: int) -> None:
        """Frees every block of a partition no longer served here and re-shares the quota.

        The original leaves such blocks valid in the shared pool; freeing them makes them the
        next recycled and keeps no data of a partition this server no longer owns.
        """
        pool = self._partitions.pop(partition_id, None)
        if pool is not None:
            for block in pool.blocks.values():
                self._free.append(block)
        for key in [key for key in self._shared if key[0] == partition_id]:
            self._free.append(self._shared.pop(key))
        self._adjust_quotas()

    def num_blocks(self, partition_id: int) -> int:
        """Blocks in a partition's local pool."""
        pool = self._partitions.get(partition_id)
        return len(pool.blocks) if pool is not None else 0

    def quota_blocks(self) -> int:
        return partition_quota_blocks(self.total_blocks, len(self._partitions))

    def num_shared_blocks(self) -> int:
        return len(self._shared)

    def num_free_blocks(self) -> int:
        return len(self._free) + self.total_blocks - self._next_unused

    def check_invariants(self) -> None:
        """Every block is in exactly one place; local pools within quota; frontiers are local."""
        placed = [*self._free, *range(self._next_unused, self.total_blocks), *self._shared.values()]
        for pool in self._partitions.values():
            assert len(pool.blocks) <= pool.quota_blocks, (len(pool.blocks), pool.quota_blocks)
            assert pool.frontier == _NO_BLOCK or pool.frontier in pool.blocks.values()
            for first, block in pool.blocks.items():
                assert self._first_transaction_id[block] == first
            placed.extend(pool.blocks.values())
        assert sorted(placed) == list(range(self.total_blocks))

    # --- blocks --------------------------------------------------------------------------

    def _pool(self, partition_id: int) -> _LocalPool:
        pool = self._partitions.get(partition_id)
        if pool is None:
            pool = self._partitions[partition_id] = _LocalPool(partition_id, MIN_PARTITION_BLOCKS)
            self._adjust_quotas()
        return pool

    def _adjust_quotas(self) -> None:
        quota_blocks = self.quota_blocks()
        for pool in self._partitions.values():
            pool.quota_blocks = quota_blocks
            self._shrink(pool, quota_blocks)

    def _find_block(self, partition_id: int, first: int) -> int:
        pool = self._partitions.get(partition_id)
        if pool is not None and first in pool.blocks:
            return pool.blocks[first]
        return self._shared.get((partition_id, first), _NO_BLOCK)

    def _local_block(self, partition_id: int, pool: _LocalPool, first: int, create: bool) -> int:
        """The block for ``first`` in the local pool: found there, taken back from the shared pool,
        or (when ``create``) recycled empty. _NO_BLOCK when there is none."""
        block = pool.blocks.get(first, _NO_BLOCK)
        if block != _NO_BLOCK:
            return block
        key = (partition_id, first)
        if not create and key not in self._shared:
            return _NO_BLOCK
        self._shrink(pool, pool.quota_blocks - 1)
        block = self._shared.pop(key, _NO_BLOCK)
        if block == _NO_BLOCK:
            block = self._recycle(pool)
            if block == _NO_BLOCK:
                return _NO_BLOCK
            self._usage[block] = 0
            self._first_transaction_id[block] = first
        pool.blocks[first] = block
        return block

    def _recycle(self, pool: _LocalPool) -> int:
        if self._free:
            return self._free.pop()
        if self._next_unused < self.total_blocks:
            self._next_unused += 1
            return self._next_unused - 1
        if self._shared:
            oldest = next(iter(self._shared))
            return self._shared.pop(oldest)
        if pool.blocks:
            oldest_first = next(iter(pool.blocks))
            block = pool.blocks.pop(oldest_first)
            if block == pool.frontier:
                pool.frontier = _NO_BLOCK
            return block
        # Only when quotas overcommit the blocks (at least 2 each): a partition holding nothing
        # takes from the largest pool rather than starve; frontiers stay, so it may still get none.
        largest = max(self._partitions.values(), key=lambda other: len(other.blocks))
        for first, block in largest.blocks.items():
            if block != largest.frontier:
                del largest.blocks[first]
                return block
        return _NO_BLOCK

    def _shrink(self, pool: _LocalPool, max_blocks: int) -> None:
        """Moves the oldest blocks but the frontier to the shared pool, still valid."""
        excess = len(pool.blocks) - max_blocks
        if excess <= 0:
            return
        victims: list[int] = []
        for first, block in pool.blocks.items():
            if block != pool.frontier:
                victims.append(first)
                if len(victims) == excess:
                    break
        for first in victims:
            self._shared[(pool.partition_id, first)] = pool.blocks.pop(first)

    def _write(self, block: int, transaction_id: int, req_id: ReqId, header: int) -> None:
        assert self._first_transaction_id[block] == transaction_id & ~FEED_CACHE_BLOCK_INDEX_MASK
        index = transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
        entry = block * FEED_CACHE_BLOCK_NUM_TRANSACTIONS + index
        # The two longs of the wire (ReqId.most_sig_bits, least_sig_bits), by two C calls: every
        # commit of a server comes here (its four fields are 32-bit ints, as its feed frame packs).
        self._req_id_msb[entry], self._req_id_lsb[entry] = _REQ_ID_LONGS.unpack(_REQ_ID_INTS.pack(*req_id))
        self._headers[entry] = header
        self._usage[block] |= 1 << index
