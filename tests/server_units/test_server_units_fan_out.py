"""Fan-out pieces: the append barrier (mounts and flushes wait for earlier appends only) and the
shared encoded feed frames (each commit encoded once, slices that stay valid)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.append_barrier import AppendBarrier
from waltz_engine.server.feed_cache import FEED_CACHE_BLOCK_NUM_TRANSACTIONS, FeedCache
from waltz_engine.server.feed_frames import FeedFrames, feed_data_frame_size_bytes
from waltz_engine.wire.client_messages import CLIENT_CODECS, FeedData

BLOCK = FEED_CACHE_BLOCK_NUM_TRANSACTIONS
FEED_CACHE_BYTES = 1 << 20
PARTITION = 3
VERSION = 4


# --- the append barrier ---------------------------------------------------------------------------


def test_work_runs_at_once_when_no_append_is_undecided() -> None:
    barrier = AppendBarrier()
    ran: list[str] = []
    assert barrier.after_issued(lambda: ran.append("now"))
    barrier.decide(barrier.issue())
    assert barrier.after_issued(lambda: ran.append("again"))
    assert ran == ["now", "again"] and barrier.num_waiting == 0


def test_work_waits_only_for_the_appends_issued_before_it() -> None:
    barrier = AppendBarrier()
    ran: list[str] = []
    first = barrier.issue()
    assert not barrier.after_issued(lambda: ran.append("mount-1"))
    assert not barrier.after_issued(lambda: ran.append("mount-2"))  # same appends: same batch
    second = barrier.issue()
    assert not barrier.after_issued(lambda: ran.append("flush"))
    assert barrier.num_waiting == 3
    barrier.decide(second)  # decided first, but the older one is not
    assert ran == []
    barrier.decide(first)
    assert ran == ["mount-1", "mount-2", "flush"] and barrier.num_waiting == 0
    assert barrier.num_undecided == 0


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_decision_order_runs_each_work_exactly_once_after_its_appends(data: st.DataObject) -> None:
    barrier = AppendBarrier()
    decided: set[int] = set()
    ran: list[int] = []
    needed: dict[int, int] = {}  # work -> appends issued before it
    issued = 0
    steps = data.draw(st.lists(st.sampled_from(["append", "work"]), max_size=40))
    for step in steps:
        if step == "append":
            assert barrier.issue() == issued
            issued += 1
        else:
            work = len(needed)
            needed[work] = issued

            def run(work: int = work) -> None:
                assert all(number in decided for number in range(needed[work])), work
                ran.append(work)

            barrier.after_issued(run)
    for number in data.draw(st.permutations(range(issued))):
        decided.add(number)
        barrier.decide(number)
    assert sorted(ran) == list(needed) and len(ran) == len(set(ran))
    assert barrier.num_waiting == 0


# --- shared encoded frames ------------------------------------------------------------------------


def _req_id(transaction_id: int) -> ReqId:
    return ReqId(-transaction_id - 1, 7, PARTITION, -(2**31) + transaction_id)


def _frame(transaction_id: int, version: int = VERSION) -> bytes:
    return CLIENT_CODECS[version].encode_frame(
        FeedData(_req_id(transaction_id), transaction_id, transaction_id * 3)
    )


def _cached(num_transactions: int) -> FeedCache:
    cache = FeedCache(FEED_CACHE_BYTES)
    for transaction_id in range(num_transactions):
        cache.add(PARTITION, transaction_id, _req_id(transaction_id), transaction_id * 3)
    return cache


def test_every_feed_gets_the_codec_bytes_and_each_transaction_is_encoded_once() -> None:
    frames = FeedFrames(PARTITION, _cached(3 * BLOCK))
    for _client in range(50):
        for first in range(0, 3 * BLOCK, BLOCK):
            view = frames.frames(VERSION, first, first + BLOCK - 1)
            assert view is not None
            assert bytes(view) == b"".join(_frame(t) for t in range(first, first + BLOCK))
    assert frames.frames_encoded == 3 * BLOCK
    # Another codec version is encoded for itself, once too.
    view = frames.frames(3, 5, 9)
    assert view is not None and bytes(view) == b"".join(_frame(t, 3) for t in range(5, 10))
    assert frames.frames_encoded == 3 * BLOCK + 5


def test_a_transaction_missing_from_the_feed_cache_comes_from_storage_headers() -> None:
    frames = FeedFrames(PARTITION, FeedCache(0))  # a cache with no room at all
    assert frames.frames(VERSION, 10, 12) is None
    frames.add(VERSION, [RecordHeader(t, _req_id(t), t * 3) for t in range(10, BLOCK)])
    view = frames.frames(VERSION, 10, 12)
    assert view is not None and bytes(view) == b"".join(_frame(t) for t in (10, 11, 12))


def test_a_slice_handed_out_stays_valid_while_its_block_fills_and_after_it_is_dropped() -> None:
    frames = FeedFrames(PARTITION, _cached(4 * BLOCK), max_blocks=2)
    held = frames.frames(VERSION, 0, 2)
    assert held is not None
    expected = bytes(held)
    assert frames.frames(VERSION, 3, BLOCK - 1) is not None  # fills the rest of its block
    for first in (BLOCK, 2 * BLOCK, 3 * BLOCK):  # and pushes it out of the bounded set
        assert frames.frames(VERSION, first, first) is not None
    assert frames.num_blocks() == 2
    assert bytes(held) == expected == b"".join(_frame(t) for t in range(3))
    assert len(held) == 3 * feed_data_frame_size_bytes(VERSION)
