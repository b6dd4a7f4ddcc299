"""Encoded FeedData frames of one partition, shared by every feed of it (reference §2.5).

A committed transaction is encoded into its FeedData frame once per codec version in use, into
a block of :data:`FEED_CACHE_BLOCK_NUM_TRANSACTIONS` consecutive txids (the feed cache's blocks),
and every feed that reaches it — the realtime clients and each mount catching up — is sent a
slice of that block: one write per feed per batch, the same bytes for all, no copy before TLS.

A FeedData frame has one size per codec version, so a block is one buffer of fixed slots filled
in any order; a slice handed to a connection only covers filled slots, which never change again,
so a connection may hold it while later slots are filled. A block is never resized or reused:
one that leaves the bounded set is dropped, and lives on only while a connection still holds a
slice of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feed_cache import (
    FEED_CACHE_BLOCK_INDEX_MASK,
    FEED_CACHE_BLOCK_NUM_TRANSACTIONS,
    FeedCache,
    block_first_transaction_id,
)
from waltz_engine.wire.client_messages import CLIENT_MAGIC, EXTENDED_CLIENT_CODECS, FeedData
from waltz_engine.wire.client_stream import FEED_DATA_FRAME, FEED_DATA_TYPE_CODE
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES

# Blocks kept per partition and codec version: 256 x 64 txids x 36 bytes = 576 KiB, enough for
# the realtime tail and the positions of the mounts catching up at once.
FEED_FRAME_BLOCKS_KEPT = 256


def feed_data_frame_size_bytes(version: int) -> int:
    """Every FeedData frame of a codec version has this size (fixed fields only)."""
    size = len(EXTENDED_CLIENT_CODECS[version].encode_frame(FeedData(ReqId(0, 0, 0, 0), 0, 0)))
    assert size == FEED_DATA_FRAME.size, (version, size)
    return size


class _Block:
    __slots__ = ("first_transaction_id", "frame_size_bytes", "buffer", "view", "filled")

    def __init__(self, first_transaction_id: int, frame_size_bytes: int) -> None:
        self.first_transaction_id = first_transaction_id
        self.frame_size_bytes = frame_size_bytes
        self.buffer = bytearray(FEED_CACHE_BLOCK_NUM_TRANSACTIONS * frame_size_bytes)
        self.view = memoryview(self.buffer)
        self.filled = 0  # bit i: the frame of first_transaction_id + i is in its slot


class FeedFrames:
    """One partition's encoded FeedData frames by (codec version, block); not thread-safe."""

    __slots__ = ("partition_id", "feed_cache", "max_blocks", "frames_encoded", "_blocks", "_frame_sizes")

    def __init__(
        self, partition_id: int, feed_cache: FeedCache, max_blocks: int = FEED_FRAME_BLOCKS_KEPT
    ) -> None:
        assert max_blocks >= 1, max_blocks
        self.partition_id = partition_id
        self.feed_cache = feed_cache
        self.max_blocks = max_blocks
        self.frames_encoded = 0  # for tests and metrics: each (txid, version) should count once
        # (version, first txid) -> block, oldest first.
        self._blocks: dict[tuple[int, int], _Block] = {}
        self._frame_sizes: dict[int, int] = {}

    def frames(self, version: int, first_transaction_id: int, last_transaction_id: int) -> memoryview | None:
        """The frames of ``first .. last`` (one block) as one buffer; None when one of them is
        neither encoded nor in the feed cache (read its header from storage, then :meth:`add`)."""
        assert first_transaction_id <= last_transaction_id, (first_transaction_id, last_transaction_id)
        block = self._block(version, first_transaction_id)
        assert last_transaction_id - block.first_transaction_id < FEED_CACHE_BLOCK_NUM_TRANSACTIONS
        low = first_transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
        high = last_transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
        wanted = ((1 << (high - low + 1)) - 1) << low
        if block.filled & wanted != wanted and not self._fill_from_cache(version, block, low, high):
            return None
        size = block.frame_size_bytes
        return block.view[low * size : (high + 1) * size]

    def add(self, version: int, record_headers: Iterable[RecordHeader]) -> None:
        """Encodes headers read from storage (the feed cache may have had no room for them)."""
        block: _Block | None = None
        for transaction_id, req_id, header in record_headers:
            if block is None or block_first_transaction_id(transaction_id) != block.first_transaction_id:
                block = self._block(version, transaction_id)
            index = transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
            if not (block.filled >> index) & 1:
                self._encode(version, block, index, req_id, header)

    def add_committed(self, transaction_id: int, req_id: ReqId, header: int) -> None:
        """A commit's frame, encoded at once into the blocks that hold its slot already (the
        realtime tail of each codec version in use), with one pack: its feed then sends it
        without reading it back from the feed cache. Other versions and blocks are encoded
        from the feed cache when a feed reaches them, as before."""
        first = transaction_id & ~FEED_CACHE_BLOCK_INDEX_MASK  # block_first_transaction_id (inline)
        index = transaction_id & FEED_CACHE_BLOCK_INDEX_MASK
        blocks = self._blocks
        for version, size in self._frame_sizes.items():
            block = blocks.get((version, first))
            if block is None or (block.filled >> index) & 1:
                continue
            # The FEED_DATA frame the client unpacks (its fields the same in every codec version).
            FEED_DATA_FRAME.pack_into(
                block.buffer,
                index * size,
                CLIENT_MAGIC,
                version,
                size - FRAME_HEADER_SIZE_BYTES,
                FEED_DATA_TYPE_CODE,
                *req_id,
                transaction_id,
                header,
            )
            block.filled |= 1 << index
            self.frames_encoded += 1

    def num_blocks(self) -> int:
        return len(self._blocks)

    def _block(self, version: int, transaction_id: int) -> _Block:
        key = (version, block_first_transaction_id(transaction_id))
        block = self._blocks.get(key)
        if block is None:
            size = self._frame_sizes.get(version)
            if size is None:
                size = self._frame_sizes[version] = feed_data_frame_size_bytes(version)
            if len(self._blocks) >= self.max_blocks:
                # The oldest made: the realtime tail is always the newest, and a mount catching up
                # moves on through its blocks.
                del self._blocks[next(iter(self._blocks))]
            block = self._blocks[key] = _Block(key[1], size)
        return block

    def _fill_from_cache(self, version: int, block: _Block, low: int, high: int) -> bool:
        get = self.feed_cache.get
        for index in range(low, high + 1):
            if not (block.filled >> index) & 1:
                cached = get(self.partition_id, block.first_transaction_id + index)
                if cached is None:
                    return False
                self._encode(version, block, index, cached[0], cached[1])
        return True

    def _encode(self, version: int, block: _Block, index: int, req_id: ReqId, header: int) -> None:
        frame = EXTENDED_CLIENT_CODECS[version].encode_frame(
            FeedData(req_id, block.first_transaction_id + index, header)
        )
        size = block.frame_size_bytes
        assert len(frame) == size, (len(frame), size)
        # Same length: the buffer is never resized, so slices handed out before stay valid.
        block.buffer[index * size : (index + 1) * size] = frame
        block.filled |= 1 << index
        self.frames_encoded += 1
