"""The outcome contract through the real client code on the mock driver: every context ends in
exactly one of on_completion(True), on_completion(False) or on_exception(OutcomeUnknownError)
(or an error before anything was sent), and an attempt is retried only once proven absent."""

from __future__ import annotations

import asyncio

import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.harness import mock_client, run

from waltz_engine.client import ClientTimeoutError, MockDriver, OutcomeUnknownError, WaltzClient
from waltz_engine.client.commit_latency import (
    INITIAL_COMMIT_LATENCY_MS,
    LONG_WAIT_FLOOR_MS,
    LONG_WAIT_LATENCY_MULTIPLE,
    CommitLatency,
)
from waltz_engine.client.partition import Partition
from waltz_engine.client.transaction_builder import TransactionBuilder
from waltz_engine.common.reqid import ReqId

WARM_UP = 5
# Far above any test's wait for an outcome: an outcome in time shows the early flush.
LONG_WAIT_CEILING_MS = 60_000
OUTCOME_WAIT_S = 10.0
DEACTIVATE_FLUSH_TIMEOUT_MS = 50
REGISTRATION_TIMEOUT_MS = 1_000


def outcome(context: MockContext) -> object:
    """What the context ended with: True, False or the exception's type."""
    assert context.future.done()
    error = context.future.exception()
    return type(error) if error is not None else context.future.result()


def test_no_retry_threads_end_a_proven_absent_append_not_committed() -> None:
    """It used to get no hook at all (the context waited for ever)."""

    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, num_transaction_retry_threads=0, long_wait_threshold_ms=200) as client:
            context = MockContext("lost")
            driver.force_next_append_fail()
            await client.submit(context)
            assert await context.result(OUTCOME_WAIT_S) is False
            assert context.exec_count == 1 and context.events == ["completion:False"]

    run(go)


def test_no_retry_threads_end_a_lock_failure_not_committed() -> None:
    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, num_transaction_retry_threads=0) as client:
            context = MockContext("conflict", write_locks=[1])
            driver.force_next_lock_fail()
            await client.submit(context)
            assert await context.result(OUTCOME_WAIT_S) is False
            assert context.events == ["lock_failure", "completion:False"]
            assert not client.has_pending_transactions()

    run(go)


def test_close_leaves_an_undecided_append_unknown() -> None:
    async def go() -> None:
        driver = MockDriver(1)
        client_context = mock_client(driver)
        client = await client_context.__aenter__()
        driver.suspend_feed()  # committed or not, the client cannot know before it closes
        context = MockContext("in flight", partition=0)
        await client.submit(context)
        await client_context.__aexit__(None, None, None)
        with pytest.raises(OutcomeUnknownError) as raised:
            await context.result(OUTCOME_WAIT_S)
        assert raised.value.partition_id == 0 and raised.value.req_id.partition_id == 0
        assert context.events == ["exception:OutcomeUnknownError"] and context.exec_count == 1

    run(go)


def test_an_append_waiting_far_longer_than_recent_commits_is_flushed_early() -> None:
    """The long-wait timer flushes at a multiple of the commit latency, not at the ceiling
    (``client.longWaitThreshold``); the lost append is proven absent, retried once, committed."""

    async def go() -> None:
        driver = MockDriver(1)
        callbacks = MockCallbacks()
        async with mock_client(driver, callbacks, long_wait_threshold_ms=LONG_WAIT_CEILING_MS) as client:
            warm_up = [MockContext(f"warm-up {i}") for i in range(WARM_UP)]
            for context in warm_up:
                await client.submit(context)
            await client.flush()
            lost = MockContext("lost once")
            driver.force_next_append_fail()
            await client.submit(lost)
            assert await lost.result(OUTCOME_WAIT_S) is True
            assert lost.exec_count == 2
            partition = client._stream_client().partition(0)
            assert partition.long_wait_flushes >= 1
            assert partition.monitor.latency.samples >= WARM_UP

    run(go)


def test_flush_returns_once_own_commits_are_applied() -> None:
    async def go() -> None:
        callbacks = MockCallbacks()
        async with mock_client(MockDriver(1), callbacks) as client:
            contexts = [MockContext(f"transaction {i}") for i in range(WARM_UP)]
            for context in contexts:
                await client.submit(context)
            await client.flush()
            assert [outcome(c) for c in contexts] == [True] * WARM_UP
            assert all(c.application.done() for c in contexts)
            assert not client.has_pending_transactions()

    run(go)


def test_a_partition_giving_up_its_flush_leaves_appends_unknown_not_failed() -> None:
    """Deactivating (set_partitions) waits a bounded time for pending appends; past it they may
    still commit, so they end unknown. They used to settle False: retried, possibly twice."""

    async def go() -> None:
        partition = Partition(0, 1, 5)
        partition.activate(-1)
        request = TransactionBuilder(partition.next_req_id(), -1).build_request()
        future = await partition.append(request, None, REGISTRATION_TIMEOUT_MS)  # no connection
        assert future is not None and not future.done()
        await partition.deactivate(DEACTIVATE_FLUSH_TIMEOUT_MS)
        assert isinstance(future.exception(), OutcomeUnknownError)
        assert not partition.has_pending_transactions

    asyncio.run(go())


def test_commit_latency_bounds_the_long_wait() -> None:
    latency = CommitLatency(ceiling_ms=5_000)
    assert latency.long_wait_ms() == LONG_WAIT_LATENCY_MULTIPLE * INITIAL_COMMIT_LATENCY_MS
    latency.observe(1.0)
    assert latency.long_wait_ms() == LONG_WAIT_FLOOR_MS  # fast commits: never below the floor
    for _ in range(100):
        latency.observe(10_000.0)
    assert latency.long_wait_ms() == 5_000  # slow commits: never above the ceiling
    assert CommitLatency(ceiling_ms=1).ceiling_ms == LONG_WAIT_FLOOR_MS


def test_req_id_is_named_in_the_unknown_outcome() -> None:
    error = OutcomeUnknownError(ReqId(7, 1, 3, 42), "the client closed")
    assert "partition 3" in str(error) and "the client closed" in str(error) and error.partition_id == 3


# Far below the default (10 s) so that several retries time out within the test.
SHORT_MOUNT_TIMEOUT_MS = 100
RECONNECT_MS = 20


class _ServerGoneOnLockFailure(MockContext):
    """Its first attempt fails its lock check; the server then goes away (a failover)."""

    def __init__(self, driver: MockDriver) -> None:
        super().__init__("through a failover", write_locks=[1])
        self.driver = driver

    def on_lock_failure(self) -> None:
        super().on_lock_failure()
        self.driver.set_reachable(False)
        asyncio.get_running_loop().call_soon(self.driver.disconnect)


FAILOVER_CONFIG = {
    "ensure_mounted_timeout_ms": SHORT_MOUNT_TIMEOUT_MS,
    "reconnect_delay_ms": RECONNECT_MS,
    "reconnect_max_delay_ms": RECONNECT_MS,
}


async def _submit_into_a_failover(client: WaltzClient, driver: MockDriver) -> _ServerGoneOnLockFailure:
    context = _ServerGoneOnLockFailure(driver)
    driver.force_next_lock_fail()
    await client.submit(context)
    return context


def _unsent_retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum("a retry could not be sent" in r.getMessage() for r in caplog.records)


def test_a_retry_waits_through_a_failover_longer_than_the_mount_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's own retry of a context proven absent is not failed by one mount bound:
    nothing of it was sent, so it is tried again until the partition is served (issue 32: the
    simulator's seeds whose failover outlasted 10 s reported such contexts failed)."""
    caplog.set_level("INFO", logger="waltz_engine.client.client")

    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, **FAILOVER_CONFIG) as client:
            context = await _submit_into_a_failover(client, driver)
            # Two mount bounds pass without a server (or the context ends: the failure shown).
            async with asyncio.timeout(OUTCOME_WAIT_S):
                while _unsent_retries(caplog) < 2 and not context.future.done():
                    await asyncio.sleep(SHORT_MOUNT_TIMEOUT_MS / 1000)
            assert not context.future.done(), context.events
            driver.set_reachable(True)
            assert await context.result(OUTCOME_WAIT_S) is True
            assert context.exec_count == 2  # the retry ran execute once it was mounted
            assert context.events[0] == "lock_failure" and "completion:True" in context.events
            assert not client.has_pending_transactions()

    run(go)


def test_a_retry_the_cluster_never_serves_fails_after_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    """Bounded: after ``max_unsent_retries`` the context fails with the mount's timeout, once."""
    caplog.set_level("INFO", logger="waltz_engine.client.client")
    max_unsent_retries = 2

    async def go() -> None:
        driver = MockDriver(1)
        async with mock_client(driver, **FAILOVER_CONFIG, max_unsent_retries=max_unsent_retries) as client:
            context = await _submit_into_a_failover(client, driver)
            with pytest.raises(ClientTimeoutError):
                await context.result(OUTCOME_WAIT_S)
            assert context.exec_count == 1
            assert context.events == ["lock_failure", "exception:ClientTimeoutError"]
            assert _unsent_retries(caplog) == max_unsent_retries
            assert not client.has_pending_transactions()

    run(go)


def test_close_while_a_retry_rides_out_a_failover_ends_it_once_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """close() while the client's own retry waits for a mount after a bound already sent it back
    to the queue: the retry's context was proven absent and nothing of the retry was sent, so it
    ends once, on_completion(False), and is not queued again."""
    caplog.set_level("INFO", logger="waltz_engine.client.client")

    async def go() -> None:
        driver = MockDriver(1)
        config = {
            "ensure_mounted_timeout_ms": SHORT_MOUNT_TIMEOUT_MS,
            "reconnect_delay_ms": RECONNECT_MS,
            "reconnect_max_delay_ms": RECONNECT_MS,
        }
        async with mock_client(driver, **config) as client:
            context = _ServerGoneOnLockFailure(driver)
            driver.force_next_lock_fail()
            await client.submit(context)
            async with asyncio.timeout(OUTCOME_WAIT_S):
                while _unsent_retries(caplog) < 1 and not context.future.done():
                    await asyncio.sleep(SHORT_MOUNT_TIMEOUT_MS / 1000)
            assert not context.future.done(), context.events
            await client.close()
            assert context.events == ["lock_failure", "completion:False"]
            assert await context.result(OUTCOME_WAIT_S) is False
            assert client._open_contexts == 0 and client._retry_queue.empty()

    run(go)
