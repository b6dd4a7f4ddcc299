"""The original's WaltzClientTest behaviours, through the real client code on the mock driver."""

from __future__ import annotations

import asyncio
import random

import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.harness import mock_client, outcomes, run, two_clients

from waltz_engine.client import (
    InvalidOperationError,
    MockDriver,
    MockServerPartition,
    PartitionInactiveError,
    TransactionBuilder,
    WaltzClient,
)

# Each flush decides at least one round of retries; three conflicting appends need a few.
MAX_FLUSH_ROUNDS = 1_000
SLOW_RETRY_S = 0.05


def test_concurrency_control_single_write_lock() -> None:
    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            d1.suspend_feed()
            d2.suspend_feed()
            ctx1 = MockContext("transaction1", write_locks=[1], retry=False)
            ctx2 = MockContext("transaction2", write_locks=[1], retry=False)
            ctx3 = MockContext("transaction3", write_locks=[2], retry=False)
            await c1.submit(ctx1)
            await c2.submit(ctx2)
            await c2.submit(ctx3)
            d1.resume_feed()
            d2.resume_feed()
            assert await outcomes(ctx1, ctx2, ctx3) == [True, False, True]
        finally:
            await c1.close()
            await c2.close()

    run(go)


def test_concurrency_control_single_read_lock() -> None:
    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            # (first lock kind, second lock kind) → whether the second one is appended
            for first, second, second_ok in (
                ("read", "read", True),
                ("write", "read", False),
                ("read", "write", True),
            ):
                d1.suspend_feed()
                d2.suspend_feed()
                ctx1 = MockContext("transaction1", retry=False, **{f"{first}_locks": [1]})  # type: ignore[arg-type]
                ctx2 = MockContext("transaction2", retry=False, **{f"{second}_locks": [1]})  # type: ignore[arg-type]
                await c1.submit(ctx1)
                await c2.submit(ctx2)
                d1.resume_feed()
                d2.resume_feed()
                assert await outcomes(ctx1, ctx2) == [True, second_ok], (first, second)
        finally:
            await c1.close()
            await c2.close()

    run(go)


def test_concurrency_control_multiple_locks() -> None:
    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            d1.suspend_feed()
            d2.suspend_feed()
            contexts = [
                MockContext("transaction1", write_locks=[1, 2], retry=False),
                MockContext("transaction2", write_locks=[1, 2], retry=False),
                MockContext("transaction3", write_locks=[2, 3], retry=False),
                MockContext("transaction4", write_locks=[4, 5], retry=False),
            ]
            await c1.submit(contexts[0])
            for context in contexts[1:]:
                await c2.submit(context)
            d1.resume_feed()
            d2.resume_feed()
            assert await outcomes(*contexts) == [True, False, False, True]
        finally:
            await c1.close()
            await c2.close()

    run(go)


async def _submit_together(contexts: list[MockContext], client: WaltzClient, *drivers: MockDriver) -> None:
    """Submit every context before any is fed back: they all execute at the same high-water mark."""
    for driver in drivers:
        driver.suspend_feed()
    for context in contexts:
        await client.submit(context)
    for driver in drivers:
        driver.resume_feed()


def test_retry() -> None:
    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            contexts = [MockContext(f"transaction{i}", write_locks=[10], retry=True) for i in range(4)]
            await _submit_together(contexts, c1, d1, d2)
            assert await outcomes(*contexts) == [True] * 4
            # All four took the same lock at the same high-water mark: three at least were re-executed.
            assert sum(c.exec_count for c in contexts) > 7
            assert all(c.events.count("lock_failure") == c.exec_count - 1 for c in contexts)
        finally:
            await c1.close()
            await c2.close()

    run(go)


class _SlowRetry(MockContext):
    """Re-executes only after a timer: the retry worker is busy while other retries queue."""

    async def execute(self, builder: TransactionBuilder) -> bool:  # type: ignore[override]
        if self.exec_count:
            await asyncio.sleep(SLOW_RETRY_S)
        return super().execute(builder)


def test_flushing_until_nothing_is_pending_waits_for_the_retries() -> None:
    """``while has_pending_transactions(): await flush()`` ends once every retry was sent again
    and decided. It used to spin without ever yielding while retries waited in the queue behind
    a busy retry worker: the worker never ran again, the loop never ended (a smoke run's "the
    clients did not flush within 180 s", with one client at 100 % CPU)."""

    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            contexts = [_SlowRetry(f"transaction{i}", write_locks=[10], retry=True) for i in range(3)]
            await _submit_together(contexts, c1, d1, d2)
            for _ in range(MAX_FLUSH_ROUNDS):  # a spin never yields: bounded rounds, not a timeout
                if not c1.has_pending_transactions():
                    break
                await c1.flush()
            else:
                pytest.fail(f"still pending after {MAX_FLUSH_ROUNDS} flushes")
            # Nothing pending means decided: every one committed, none still in flight.
            assert all(c.future.done() for c in contexts)
            assert await outcomes(*contexts) == [True] * 3
            assert sum(c.exec_count for c in contexts) >= 5  # two lost the lock, at least once each
        finally:
            await c1.close()
            await c2.close()

    run(go)


class _RaisingRetry(MockContext):
    """Its application raises when it is executed again (a retry)."""

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.exec_count:
            self.exec_count += 1
            raise RuntimeError("the application failed (injected)")
        return super().execute(builder)


def test_a_retry_whose_execute_raises_does_not_stop_the_retries() -> None:
    """An application's error in a retried execute is reported to that append (on_exception) and
    the retry worker goes on: it used to end the worker (only WaltzError was caught), so every
    later retry waited in the queue forever and flush timed out."""

    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            d1.suspend_feed()
            d2.suspend_feed()
            winner = MockContext("winner", write_locks=[10])
            raising = _RaisingRetry("raising", write_locks=[10])
            later = MockContext("later", write_locks=[10])
            for context in (winner, raising, later):
                await c1.submit(context)
            d1.resume_feed()
            d2.resume_feed()
            assert await winner.result() is True
            with pytest.raises(RuntimeError):
                await raising.result()
            assert await later.result() is True
            await c1.flush()
            assert not c1.has_pending_transactions()
        finally:
            await c1.close()
            await c2.close()

    run(go)


def test_catch_up() -> None:
    num_transactions = 2000

    async def go() -> None:
        partitions = MockServerPartition.create(1)
        async with mock_client(MockDriver(1, partitions), MockCallbacks()) as client1:
            contexts = [MockContext(f"transaction{i}") for i in range(num_transactions)]
            for context in contexts:
                await client1.submit(context)
            assert await outcomes(*contexts) == [True] * num_transactions
            hwm = num_transactions - 1
            callbacks = [MockCallbacks({0: -1}), MockCallbacks({0: hwm - 50}), MockCallbacks({0: hwm - 30})]
            async with (
                mock_client(MockDriver(2, partitions), callbacks[0]) as client2,
                mock_client(MockDriver(3, partitions), callbacks[1]) as client3,
                mock_client(MockDriver(4, partitions), callbacks[2]) as client4,
            ):
                for cb in callbacks:
                    await cb.wait_for_high_water_mark(0, hwm)
                assert [len(cb.applied) for cb in callbacks] == [hwm + 1, 50, 30]
                for i, client in enumerate((client2, client3, client4)):
                    context = MockContext(f"transaction{num_transactions + i}")
                    await client.submit(context)
                    assert await context.result()
                for cb in callbacks:
                    await cb.wait_for_high_water_mark(0, hwm + 3)
                assert [len(cb.applied) for cb in callbacks] == [hwm + 4, 53, 33]
                txids = [t for _, t, _, _ in callbacks[0].applied]
                assert txids == list(range(hwm + 4)), "applied strictly in transaction id order"

    run(go)


def test_get_transaction_data() -> None:
    async def go() -> None:
        rand = random.Random(7)
        callbacks = MockCallbacks({0: -1}, fetch_data=True)
        async with mock_client(MockDriver(), callbacks) as client:
            expected = [f"data={rand.randrange(1 << 31)}" for _ in range(300)]
            contexts = [MockContext(data) for data in expected]
            for context in contexts:
                await client.submit(context)
            assert await outcomes(*contexts) == [True] * len(contexts)
            await callbacks.wait_for_high_water_mark(0, len(expected) - 1)
            assert callbacks.data == expected

    run(go)


def test_append_failure_detection() -> None:
    async def go() -> None:
        driver = MockDriver(1)
        # No flush from the application: the nudge (longWaitThreshold) must detect the loss.
        async with mock_client(driver, long_wait_threshold_ms=200) as client:
            context = MockContext("transaction1", retry=False)
            driver.force_next_append_fail()
            await client.submit(context)
            assert await context.result() is False
            assert context.exec_count == 2  # the retry found nothing to do

    run(go)


def test_on_application() -> None:
    async def go() -> None:
        callbacks = MockCallbacks({0: -1})
        async with mock_client(MockDriver(1), callbacks, long_wait_threshold_ms=200) as client:
            context = MockContext("transaction1", retry=False)
            seen: list[int] = []
            context.application.add_done_callback(
                lambda _: seen.append(callbacks.get_client_high_water_mark(0))
            )
            await client.submit(context)
            assert await context.result() is True
            await asyncio.wait_for(asyncio.wrap_future(context.application), 10)
            assert seen == [0], "on_application runs after the high-water mark was updated"
            assert context.events == ["completion:True", "application"]

    run(go)


def test_on_lock_failure() -> None:
    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, long_wait_threshold_ms=200) as client:
            context = MockContext("transaction1", retry=False)
            driver.force_next_lock_fail()
            await client.submit(context)
            assert await asyncio.wait_for(asyncio.wrap_future(context.lock_failure), 10)
            assert await context.result() is False

    run(go)


def test_set_partitions_auto_mount_on() -> None:
    async def go() -> None:
        callbacks = MockCallbacks({0: -1, 1: -1, 2: -1})
        async with mock_client(MockDriver(1, 3), callbacks) as client:
            context = MockContext("transaction1", retry=False)
            await client.submit(context)
            assert await context.result()
            with pytest.raises(InvalidOperationError):
                await client.set_partitions({0})
            assert client.get_partitions() == {0, 1, 2}

    run(go)


def test_set_partitions_auto_mount_off() -> None:
    async def go() -> None:
        callbacks = MockCallbacks({0: -1, 1: -1, 2: -1}, fetch_data=True)
        async with mock_client(MockDriver(2, 3), callbacks, auto_mount=False) as client:
            assert client.get_partitions() == set()
            context = MockContext("transaction1", retry=False)
            with pytest.raises(PartitionInactiveError):
                await client.submit(context)
            assert context.events == ["exception:PartitionInactiveError"]
            await client.set_partitions({0})
            assert client.get_partitions() == {0}
            context = MockContext("transaction1", retry=False)
            await client.submit(context)
            assert await context.result()
            await callbacks.wait_for_high_water_mark(0, 0)
            assert callbacks.data == ["transaction1"]
            await client.set_partitions({1})
            assert client.get_partitions() == {1}
            with pytest.raises(PartitionInactiveError):
                await client.submit(MockContext("again", partition=0))

    run(go)
