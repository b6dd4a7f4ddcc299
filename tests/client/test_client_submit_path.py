"""The submit path's direct way (issue 33): a submit that finds its partition mounted and room in
the monitor runs through without suspending; every wait it skips is still taken, in order, when
needed. And the APPEND frame packed in one go is the codec's frame, byte for byte."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import random
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.harness import mock_client, outcomes, run

from waltz_engine.client import MockDriver, TransactionBuilder, WaltzClient, WaltzClientConfig
from waltz_engine.client.transaction_monitor import TransactionFuture, TransactionMonitor
from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import EXTENDED_CLIENT_CODECS, AppendRequest, lone_append_frame
from waltz_engine.wire.errors import EncodeError

OUTCOME_WAIT_S = 10.0
LONG_TIMEOUT_MS = 60_000
SHORT_TIMEOUT_MS = 20
INT32_MAX = (1 << 31) - 1


def rid(seq: int) -> ReqId:
    return ReqId(7, 3, 0, seq)


def append(
    seq: int, data: bytes | None = b"x" * 512, locks: tuple[int, ...] = (), header: int = 0
) -> AppendRequest:
    checksum = crc32(data) if data is not None else 0
    return AppendRequest(rid(seq), 41, locks, (), (), header, data, checksum)


# -- the frame ------------------------------------------------------------------------------------


def test_lone_append_frame_is_the_codecs_frame() -> None:
    randomly = random.Random(33)
    for version, codec in EXTENDED_CLIENT_CODECS.items():
        for size in (0, 1, 512, 70_000):
            data = randomly.randbytes(size)
            request = AppendRequest(
                ReqId(randomly.randrange(1 << 31), -1, randomly.randrange(64), -(1 << 31)),
                randomly.randrange(-1, 1 << 62),
                (),
                (),
                (),
                randomly.randrange(-(1 << 31), 1 << 31),
                data,
                crc32(data),
            )
            frame = lone_append_frame(request, version)
            if version < 2:  # no append-lock array in the frame: the codec encodes it
                assert frame is None
            else:
                assert frame == codec.encode_frame(request), (version, size)


def test_lone_append_frame_leaves_the_rest_to_the_codec() -> None:
    codec = max(EXTENDED_CLIENT_CODECS.items())[1]
    version = codec.version
    assert lone_append_frame(append(1, locks=(5,)), version) is None  # locks: the codec's general path
    assert lone_append_frame(append(1, data=None), version) is None
    out_of_range = append(1, header=INT32_MAX + 1)
    assert lone_append_frame(out_of_range, version) is None
    with pytest.raises(EncodeError):  # and the codec refuses it, as before
        codec.encode_frame(out_of_range)


# -- the monitor: room is taken in turn -----------------------------------------------------------


def run_monitor(capacity: int, test: Callable[[TransactionMonitor], Coroutine[Any, Any, None]]) -> None:
    """``test`` on a started monitor of ``capacity`` slots, closed afterwards."""

    async def go() -> None:
        monitor = TransactionMonitor(capacity)
        monitor.start()
        try:
            await test(monitor)
        finally:
            monitor.close()

    run(go)


def test_register_now_waits_behind_an_append_waiting_for_room() -> None:
    """A slot freed while an append waits for room goes to that append, not to a submit that
    arrives before the waiter runs (the direct path must not overtake it)."""

    async def go(monitor: TransactionMonitor) -> None:
        first = monitor.register_now(rid(1), None)
        assert first is not None and monitor.register_now(rid(2), None) is None  # full
        waiting = asyncio.create_task(monitor.register(rid(2), None, LONG_TIMEOUT_MS))
        await asyncio.sleep(0)
        monitor.committed(rid(1))  # room, but rid(2) waits for it first
        assert not waiting.done()
        assert monitor.register_now(rid(3), None) is None
        late = asyncio.create_task(monitor.register(rid(3), None, LONG_TIMEOUT_MS))
        second = await waiting
        assert second is not None and list(monitor._registered) == [rid(2)]
        monitor.committed(rid(2))
        third = await late
        assert third is not None and list(monitor._registered) == [rid(3)]

    run_monitor(1, go)


def test_waiters_register_first_come_first_served() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        for seq in (1, 2):
            assert monitor.register_now(rid(seq), None) is not None
        order: list[ReqId] = []

        async def wait(seq: int) -> None:
            future = await monitor.register(rid(seq), None, LONG_TIMEOUT_MS)
            assert future is not None
            order.append(future.req_id)

        waiters = [asyncio.create_task(wait(seq)) for seq in range(3, 8)]
        await asyncio.sleep(0)
        for seq in range(1, 6):
            if seq % 2:
                monitor.committed(rid(seq))
            else:
                monitor.abort(rid(seq))  # a lock failure frees its slot too
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        assert order == [rid(seq) for seq in range(3, 8)]

    run_monitor(2, go)


def test_a_waiter_that_timed_out_keeps_its_place_while_on_full_runs() -> None:
    async def go(monitor: TransactionMonitor) -> None:
        assert monitor.register_now(rid(1), None) is not None
        flushes = 0
        flushed = asyncio.Event()

        async def on_full() -> None:
            nonlocal flushes
            flushes += 1
            flushed.set()

        patient = asyncio.create_task(monitor.register(rid(2), None, SHORT_TIMEOUT_MS, on_full))
        await asyncio.sleep(0)
        later = asyncio.create_task(monitor.register(rid(3), None, LONG_TIMEOUT_MS))
        await flushed.wait()
        assert flushes >= 1 and not patient.done() and not later.done()
        monitor.committed(rid(1))
        first: TransactionFuture | None = await patient
        assert first is not None and first.req_id == rid(2) and not later.done()
        monitor.committed(rid(2))
        assert (await later) is not None
        # Without on_full, the timed-out waiter gives up its place and answers None.
        assert await monitor.register(rid(4), None, SHORT_TIMEOUT_MS) is None
        assert not monitor._queue

    run_monitor(1, go)


# -- the client -----------------------------------------------------------------------------------


def test_a_submit_while_unmounted_waits_for_the_mount() -> None:
    async def go() -> None:
        driver = MockDriver(1)
        driver.set_reachable(False)
        async with mock_client(driver, reconnect_delay_ms=10, reconnect_max_delay_ms=20) as client:
            context = MockContext("after the mount")
            submitting = asyncio.create_task(client.submit(context))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not submitting.done() and context.exec_count == 0  # waits in ensure_mounted
            assert driver.partitions[0].high_water_mark == -1
            driver.set_reachable(True)
            await submitting
            assert await context.result(OUTCOME_WAIT_S) is True
            assert driver.partitions[0].transaction_data(0) == b"after the mount"

    run(go)


def test_submits_with_the_monitor_full_wait_their_turn_in_order() -> None:
    """With one slot, held by an append the feed does not answer yet, later submits wait; one
    made while they wait (even as the slot frees) goes behind them: the log has them in the
    order they were submitted, and no submit overtook another."""

    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, max_concurrent_transactions=1) as client:
            await client.ensure_mounted(0)
            driver.suspend_feed()
            first = MockContext("0")
            await client.submit(first)  # the direct path: sent, the slot taken
            waiting = [asyncio.create_task(client.submit(MockContext(str(i)))) for i in (1, 2)]
            for _ in range(5):
                await asyncio.sleep(0)
            assert not any(task.done() for task in waiting)
            late = asyncio.create_task(client.submit(MockContext("3")))
            driver.resume_feed()
            await asyncio.gather(*waiting, late)
            await client.flush()
            log = driver.partitions[0]
            assert [log.transaction_data(t) for t in range(log.high_water_mark + 1)] == [
                b"0",
                b"1",
                b"2",
                b"3",
            ]
            assert await first.result(OUTCOME_WAIT_S) is True

    run(go)


class _CoroutineContext(MockContext):
    async def execute(self, builder: TransactionBuilder) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().execute(builder)


def test_execute_runs_on_the_loop_as_a_coroutine_or_on_the_executor() -> None:
    """One helper calls the application's callbacks: a plain ``execute`` on the loop within the
    submit, a coroutine one awaited, both on the executor when there is one; each commits once.
    On the executor a callback runs only once its awaitable is awaited (a feed step abandoned
    unstarted must not apply its transaction)."""

    async def go() -> None:
        loop_thread = threading.get_ident()
        with _CountingExecutor(1) as executor:
            for callback_executor in (None, executor):
                client = await WaltzClient.create(
                    MockCallbacks(),
                    WaltzClientConfig(mock_driver=MockDriver(1)),
                    callback_executor=callback_executor,
                )
                try:
                    await client.ensure_mounted(0)
                    contexts = [MockContext("plain"), _CoroutineContext("coroutine")]
                    for context in contexts:
                        await client.submit(context)
                    assert await outcomes(*contexts) == [True, True]
                    assert [c.exec_count for c in contexts] == [1, 1]
                    threads: list[int] = []
                    submitted = executor.submitted
                    called = client._call(_record_thread, threads)
                    if callback_executor is None:
                        assert threads == [loop_thread] and called is None
                    else:
                        assert inspect.isawaitable(called) and executor.submitted == submitted
                        await called
                        assert len(threads) == 1 and threads[0] != loop_thread
                finally:
                    await client.close()

    run(go)


class _CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def _record_thread(threads: list[int]) -> None:
    threads.append(threading.get_ident())
