"""The original's TransactionMonitorTest, on the asyncio monitor."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from client_support.app import MockContext

from waltz_engine.client import OutcomeUnknownError, PartitionInactiveError
from waltz_engine.client.config import DEFAULT_MAX_CONCURRENT_TRANSACTIONS
from waltz_engine.client.transaction_monitor import TransactionFuture, TransactionMonitor
from waltz_engine.common.reqid import ReqId

TIMEOUT_MS = 100


def run(test: Callable[[TransactionMonitor], Coroutine[Any, Any, None]]) -> None:
    async def go() -> None:
        monitor = TransactionMonitor(DEFAULT_MAX_CONCURRENT_TRANSACTIONS)
        try:
            await asyncio.wait_for(test(monitor), 60)
        finally:
            monitor.close()

    asyncio.run(go())


def rid(seq: int, client: int = 0) -> ReqId:
    return ReqId(client, 0, 0, seq)


async def reg(
    monitor: TransactionMonitor, req_id: ReqId, context: MockContext | None = None
) -> TransactionFuture:
    future = await monitor.register(req_id, context, TIMEOUT_MS)
    assert future is not None
    return future


def test_register() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        f1 = await reg(monitor, rid(1))
        assert not f1.done()
        duplicate = await reg(monitor, rid(1))
        assert duplicate.done() and duplicate.result() is False
        f2, f3, f4 = [await reg(monitor, rid(i)) for i in (2, 3, 4)]
        monitor.committed(rid(1))
        assert f1.result() is True and not any(f.done() for f in (f2, f3, f4))
        monitor.committed(rid(4))
        assert [f2.result(), f3.result(), f4.result()] == [False, False, True]

    run(go)


def test_transaction_context() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        context = MockContext()
        future = await reg(monitor, rid(1), context)
        assert future.context is context
        assert monitor.get_transaction_context(rid(1)) is context
        assert monitor.committed(rid(1)) is context

    run(go)


def test_suspend_resume() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        assert not monitor.stop()
        assert monitor.start() and not monitor.is_stopped
        assert not monitor.start()
        assert monitor.stop() and monitor.is_stopped
        future = await reg(monitor, rid(1))
        with pytest.raises(PartitionInactiveError):
            future.result()
        monitor.start()
        f1, f2 = await reg(monitor, rid(1)), await reg(monitor, rid(2))
        monitor.committed(rid(1))
        assert f1.done() and not f2.done()
        monitor.stop()
        monitor.committed(rid(2))  # a stopped monitor still settles what it holds
        assert f2.result() is True

    run(go)


def test_register_timeout() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        for i in range(monitor.max_capacity):
            assert not (await reg(monitor, rid(i))).done()
        for i in range(3):
            assert await monitor.register(rid(monitor.max_capacity + i), None, TIMEOUT_MS) is None

    run(go)


def test_abort() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        futures = {rid(i): await reg(monitor, rid(i)) for i in range(monitor.max_capacity)}
        order = list(futures)
        random.Random(3).shuffle(order)
        remaining = len(order)
        for req_id in order:
            monitor.abort(req_id)
            remaining -= 1
            assert futures[req_id].result() is False and not futures[req_id].is_flushed
            assert sum(not f.done() for f in futures.values()) == remaining == monitor.registered_count

    run(go)


def test_flush() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        capacity = monitor.max_capacity
        futures = [await reg(monitor, rid(i)) for i in range(capacity)]
        aborted = capacity // 2
        monitor.abort(rid(aborted))

        def check(flushed: int) -> None:
            monitor.flush(rid(flushed))
            remaining = 0
            for i, future in enumerate(futures):
                if i <= flushed:
                    assert future.result() is False and future.is_flushed
                else:
                    assert not future.is_flushed
                    if i == aborted:
                        assert future.result() is False
                    else:
                        assert not future.done()
                        remaining += 1
            assert monitor.registered_count == remaining

        for flushed in (capacity // 2 - 1, aborted, capacity // 2 + 1, capacity - 1):
            check(flushed)
        assert monitor.registered_count == 0

    run(go)


def test_close_leaves_undecided_appends_unknown() -> None:
    """Closing is no proof of absence: an undecided append may still commit, so it is never
    reported False (that would retry it) but OutcomeUnknownError naming it."""

    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        futures = [await reg(monitor, rid(i, client=i)) for i in range(1, 5)]
        monitor.committed(rid(1, 1))
        monitor.committed(rid(2, 2))
        assert all(f.result() is True and f.is_flushed for f in futures[:2])
        assert not any(f.done() or f.is_flushed for f in futures[2:])
        monitor.close()
        for index, future in enumerate(futures[2:], 3):
            assert future.is_flushed
            with pytest.raises(OutcomeUnknownError) as raised:
                future.result()
            assert raised.value.req_id == rid(index, client=index)
            assert raised.value.partition_id == 0

    run(go)


def test_max_concurrent_transactions() -> None:
    num_req_ids = 1000

    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        registered = 0
        most_undecided = 0

        async def writer() -> None:
            nonlocal registered
            for i in range(num_req_ids):
                assert await monitor.register(rid(i), None, 10_000) is not None
                registered = i + 1

        async def reader() -> None:
            nonlocal most_undecided
            rand = random.Random(5)
            for i in range(num_req_ids):
                while registered <= i:
                    await asyncio.sleep(0)
                if rand.randrange(20) == 0:
                    await asyncio.sleep(0.001)
                most_undecided = max(most_undecided, monitor.registered_count)
                monitor.committed(rid(i))

        await asyncio.gather(writer(), reader())
        assert most_undecided == monitor.max_capacity, "the writer was held at capacity, never beyond"
        assert monitor.registered_count == 0

    run(go)


def test_last_enqueued() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        f1 = await reg(monitor, rid(1))
        assert monitor.last_enqueued() is f1 and monitor.oldest_undecided() is f1
        f2 = await reg(monitor, rid(2))
        assert monitor.last_enqueued() is f2 and monitor.oldest_undecided() is f1
        monitor.committed(rid(1))
        assert monitor.last_enqueued() is f2 and monitor.oldest_undecided() is f2
        monitor.committed(rid(2))
        assert monitor.last_enqueued() is None and monitor.oldest_undecided() is None
        assert monitor.latency.samples == 2

    run(go)


def test_abandon() -> None:
    num_req_ids = 1000

    async def go(monitor: TransactionMonitor) -> None:
        monitor.start()
        futures: list[TransactionFuture] = []
        rand = random.Random(11)

        async def writer() -> None:
            for i in range(num_req_ids):
                future = await monitor.register(rid(i), None, 10_000)
                assert future is not None
                futures.append(future)

        async def reader_and_cleaner() -> None:
            for i in range(num_req_ids):
                while len(futures) <= i:
                    await asyncio.sleep(0)
                if rand.randrange(20) == 0:
                    monitor.abandon("test")
                monitor.committed(rid(i))

        await asyncio.gather(writer(), reader_and_cleaner())
        assert monitor.registered_count == 0
        assert all(f.done() and f.is_flushed for f in futures)
        # Abandoned ones are unknown (never False: that would retry them), committed ones
        # succeeded; both happened.
        outcomes = {type(f.exception()) if f.exception() else f.result() for f in futures}
        assert outcomes == {True, OutcomeUnknownError}

    run(go)
