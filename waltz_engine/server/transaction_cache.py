"""The transaction data cache: recent transactions' data in one ring buffer (§2.5).

As the original's ``TransactionCache``: entries ``partitionId:int32, txid:int64, len:int32, data,
checksum:int32`` (big-endian, like a ``ByteBuffer``) are written one after another into a buffer of
``transaction_data_cache_size_bytes``; to make room the oldest entries are reclaimed, dropping them
from the index. When an entry does not fit before the end of the buffer, the key (-1, -1) marks the
rest as unused and writing starts again at 0. An entry larger than a quarter of the buffer is not
cached, so one transaction cannot flush most of the cache.

Unlike the original, reclaiming skips an entry by the length stored in the buffer rather than by its
index descriptor, so entries dropped from the index early (``remove_partition``) are still skipped
one by one instead of ending the lap, and no entry that fits is ever left indexed but unreclaimed.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from waltz_engine.common.metrics import Meter, MetricsRegistry
from waltz_engine.common.zeroed import zeroed_bytes

DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES = 128 * 1024 * 1024
# An entry is cached only if it takes at most this fraction of the buffer.
MAX_ENTRY_FRACTION = 4

_ENTRY_HEADER = struct.Struct(">iqi")  # partition id, txid, data length
_CHECKSUM = struct.Struct(">i")
_KEY = struct.Struct(">iq")
ENTRY_HEADER_SIZE_BYTES = _ENTRY_HEADER.size
ENTRY_OVERHEAD_SIZE_BYTES = ENTRY_HEADER_SIZE_BYTES + _CHECKSUM.size
assert ENTRY_OVERHEAD_SIZE_BYTES == 20
# The wrap marker's key; no partition has a negative id.
WRAP_MARKER_PARTITION_ID = -1
WRAP_MARKER_TRANSACTION_ID = -1

METRIC_GROUP = "waltz-server"
TRANSACTION_CACHE_MISS_METER = "transaction-cache-miss"

TransactionData = tuple[bytes, int]  # (data, checksum)


def entry_size_bytes(data_size_bytes: int) -> int:
    return ENTRY_OVERHEAD_SIZE_BYTES + data_size_bytes


class TransactionCache:
    """Shared by every partition of a server. Not thread-safe: one event loop owns it.

    Memory: the buffer, plus an index of at most ``size_bytes // 20`` offsets.
    """

    __slots__ = ("size_bytes", "max_entry_size_bytes", "_buffer", "_index", "_start", "_end", "_miss_meter")

    def __init__(self, size_bytes: int, metrics: MetricsRegistry | None = None) -> None:
        assert size_bytes >= 0, size_bytes
        self.size_bytes = size_bytes
        self.max_entry_size_bytes = size_bytes // MAX_ENTRY_FRACTION
        self._buffer = zeroed_bytes(size_bytes)
        # partition id -> txid -> offset of its entry, so a partition is dropped in one step.
        self._index: dict[int, dict[int, int]] = {}
        # Free space is [_start, _end); live entries are [_end, size_bytes) then [0, _start).
        self._start = 0
        self._end = size_bytes
        self._miss_meter: Meter | None = (
            metrics.meter(METRIC_GROUP, TRANSACTION_CACHE_MISS_METER) if metrics is not None else None
        )

    def get(self, partition_id: int, transaction_id: int) -> TransactionData | None:
        """(data, checksum) of a cached transaction; None (and a miss marked) otherwise."""
        transactions = self._index.get(partition_id)
        offset = transactions.get(transaction_id) if transactions is not None else None
        if offset is None:
            if self._miss_meter is not None:
                self._miss_meter.mark()
            return None
        entry_partition_id, entry_transaction_id, data_size_bytes = _ENTRY_HEADER.unpack_from(
            self._buffer, offset
        )
        assert (entry_partition_id, entry_transaction_id) == (partition_id, transaction_id)
        data_offset = offset + ENTRY_HEADER_SIZE_BYTES
        data = bytes(self._buffer[data_offset : data_offset + data_size_bytes])
        (checksum,) = _CHECKSUM.unpack_from(self._buffer, data_offset + data_size_bytes)
        return data, checksum

    def put(self, partition_id: int, transaction_id: int, data: bytes, checksum: int) -> bool:
        """Caches a transaction; False when it is too large to (the cache is unchanged)."""
        assert partition_id >= 0 and transaction_id >= 0, (partition_id, transaction_id)
        # (Every commit of a server comes here: sizes and the room check are inline.)
        data_size_bytes = len(data)
        size_bytes = ENTRY_OVERHEAD_SIZE_BYTES + data_size_bytes  # entry_size_bytes
        if size_bytes > self.max_entry_size_bytes:
            return False
        transactions = self._index.get(partition_id)
        if transactions is None:
            transactions = self._index[partition_id] = {}
        elif transaction_id in transactions:
            return True  # committed data never changes: the cached copy is the same
        offset = self._start
        if self._end - offset < size_bytes:
            self._reclaim(size_bytes)
            offset = self._start
        buffer = self._buffer
        _ENTRY_HEADER.pack_into(buffer, offset, partition_id, transaction_id, data_size_bytes)
        data_offset = offset + ENTRY_HEADER_SIZE_BYTES
        end = data_offset + data_size_bytes
        buffer[data_offset:end] = data
        _CHECKSUM.pack_into(buffer, end, checksum)
        self._start = offset + size_bytes
        # _reclaim may have emptied and dropped this partition's index.
        self._index.setdefault(partition_id, transactions)[transaction_id] = offset
        return True

    def remove_partition(self, partition_id: int) -> None:
        """Forgets a partition's entries; their bytes are reclaimed in turn like any other."""
        self._index.pop(partition_id, None)

    def clear(self) -> None:
        self._index.clear()
        self._start = 0
        self._end = self.size_bytes

    def num_entries(self) -> int:
        return sum(len(transactions) for transactions in self._index.values())

    def _reclaim(self, target_size_bytes: int) -> None:
        """Evicts the oldest entries until ``target_size_bytes`` are free at ``_start``."""
        assert target_size_bytes <= self.max_entry_size_bytes
        buffer = self._buffer
        while self._end - self._start < target_size_bytes:
            if self.size_bytes - self._end >= ENTRY_OVERHEAD_SIZE_BYTES:
                partition_id, transaction_id, data_size_bytes = _ENTRY_HEADER.unpack_from(buffer, self._end)
                if partition_id == WRAP_MARKER_PARTITION_ID:
                    assert transaction_id == WRAP_MARKER_TRANSACTION_ID
                    self._end = self.size_bytes
                else:
                    self._forget(partition_id, transaction_id, self._end)
                    self._end += entry_size_bytes(data_size_bytes)
                    assert self._end <= self.size_bytes
            elif self._end < self.size_bytes:
                # A tail this short holds no entry (nor a marker): it was left unused.
                self._end = self.size_bytes
            else:
                # Nothing left to reclaim up to the end: mark the free tail unused and wrap.
                if self.size_bytes - self._start >= ENTRY_OVERHEAD_SIZE_BYTES:
                    _KEY.pack_into(buffer, self._start, WRAP_MARKER_PARTITION_ID, WRAP_MARKER_TRANSACTION_ID)
                self._start = 0
                self._end = 0

    def _forget(self, partition_id: int, transaction_id: int, offset: int) -> None:
        transactions = self._index.get(partition_id)
        # The entry may be gone already (remove_partition) or re-put elsewhere since.
        if transactions is not None and transactions.get(transaction_id) == offset:
            del transactions[transaction_id]
            if not transactions:
                del self._index[partition_id]


# Misses of one burst of data requests are read with one RECORD_LIST per contiguous run of txids,
# at most this many records each (a run longer than this is split): 64 records of 512 B are one
# 33 KiB answer, and a burst is never held behind one huge storage read.
MAX_TRANSACTIONS_PER_LOAD = 64

# (first txid, count) -> the data and checksum of each of those transactions, in order; raises if
# any of them cannot be read (then every request of the range gets the error).
LoadRange = Callable[[int, int], Awaitable[list[TransactionData]]]


class TransactionFetcher:
    """Serves TRANSACTION_DATA_REQUEST: the cache, else one load per key however many ask.

    Concurrent fetches of a key await one shared load (as the original shares one future); a load
    is not cancelled when a waiter is, and its result, or failure, is forgotten once it ends (the
    original keeps a failed future, so that key would fail forever). ``fetch_many`` reads the misses
    of a burst in ranges, one task per range, instead of one storage request per transaction.
    """

    __slots__ = ("cache", "_loads", "_tasks")

    def __init__(self, cache: TransactionCache) -> None:
        self.cache = cache
        self._loads: dict[tuple[int, int], asyncio.Future[TransactionData]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    def num_loading(self) -> int:
        return len(self._loads)

    async def fetch(
        self,
        partition_id: int,
        transaction_id: int,
        load: Callable[[], Awaitable[TransactionData]],
    ) -> TransactionData:
        async def load_one(first: int, count: int) -> list[TransactionData]:
            assert (first, count) == (transaction_id, 1)
            return [await load()]

        (found,) = self.fetch_many(partition_id, [transaction_id], load_one)
        if isinstance(found, tuple):
            return found
        return await asyncio.shield(found)

    def fetch_many(
        self, partition_id: int, transaction_ids: list[int], load_range: LoadRange
    ) -> list[TransactionData | asyncio.Future[TransactionData]]:
        """Each transaction's cached (data, checksum), or a future of its load.

        The misses not loading already are sorted into contiguous runs, and each run of at most
        ``MAX_TRANSACTIONS_PER_LOAD`` is read by one ``load_range`` task.
        """
        loads = self._loads
        cache = self.cache
        found: list[TransactionData | asyncio.Future[TransactionData]] = []
        missing: list[int] = []
        for transaction_id in transaction_ids:
            key = (partition_id, transaction_id)
            pending = loads.get(key)
            if pending is None:
                cached = cache.get(partition_id, transaction_id)
                if cached is not None:
                    found.append(cached)
                    continue
                pending = loads[key] = asyncio.get_running_loop().create_future()
                pending.add_done_callback(_retrieve_exception)
                missing.append(transaction_id)
            found.append(pending)
        if missing:
            self._start_loads(partition_id, sorted(missing), load_range)
        return found

    def _start_loads(self, partition_id: int, missing: list[int], load_range: LoadRange) -> None:
        loop = asyncio.get_running_loop()
        runs: list[tuple[int, int]] = []
        first = previous = missing[0]
        for transaction_id in missing[1:]:
            if transaction_id != previous + 1 or transaction_id - first >= MAX_TRANSACTIONS_PER_LOAD:
                runs.append((first, previous - first + 1))
                first = transaction_id
            previous = transaction_id
        runs.append((first, previous - first + 1))
        for first, count in runs:
            task = loop.create_task(self._load(partition_id, first, count, load_range))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _load(self, partition_id: int, first: int, count: int, load_range: LoadRange) -> None:
        loads = self._loads
        try:
            found = await load_range(first, count)
            assert len(found) == count, (first, count, len(found))
        except BaseException as e:
            for transaction_id in range(first, first + count):
                pending = loads.pop((partition_id, transaction_id))
                if not pending.done():
                    pending.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        put = self.cache.put
        for transaction_id, (data, checksum) in enumerate(found, first):
            put(partition_id, transaction_id, data, checksum)
            pending = loads.pop((partition_id, transaction_id))
            if not pending.done():
                pending.set_result((data, checksum))


def _retrieve_exception(future: asyncio.Future[TransactionData]) -> None:
    # Every waiter may have been cancelled; do not let asyncio log the failure as unhandled.
    if not future.cancelled():
        future.exception()
