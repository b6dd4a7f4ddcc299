"""The original's MockDriverTest: the mock driver's log, sharing and faults."""

from __future__ import annotations

import asyncio
import random

from client_support.app import MockCallbacks, MockContext
from client_support.harness import mock_client, outcomes, run, two_clients

from waltz_engine.client import (
    DataChecksumError,
    MockDriver,
    MockServerPartition,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_engine.client.config import DEFAULT_MAX_CONCURRENT_TRANSACTIONS


def test_basic_single_client_log_and_data() -> None:
    async def go() -> None:
        rand = random.Random(1)
        callbacks = MockCallbacks({0: -1}, fetch_data=True)
        driver = MockDriver()
        async with mock_client(driver, callbacks) as client:
            sent = [(rand.randrange(-(1 << 31), 1 << 31), f"transaction{i}") for i in range(100)]
            for i, (header, data) in enumerate(sent):
                context = MockContext(data, header=header)
                await client.submit(context)
                await callbacks.wait_for_high_water_mark(0, i)
                assert await context.result()
            assert [(h, d) for (_, _, h, _), d in zip(callbacks.applied, callbacks.data, strict=True)] == sent
            assert len(callbacks.req_ids()) == 100
            assert all(r.client_id == driver.client_id for r in callbacks.req_ids())
            for i, (_, data) in enumerate(sent):
                assert await client.rpc_client.get_transaction_data(0, i) == data.encode()

    run(go)


def test_basic_two_clients_share_partitions() -> None:
    async def go() -> None:
        partitions = MockServerPartition.create(1)
        async with mock_client(MockDriver(1, partitions), MockCallbacks()) as client1:
            for i in range(100):
                await client1.submit(MockContext(f"transaction{i}"))
            await client1.flush()
            callbacks2 = MockCallbacks({0: 49})
            async with mock_client(MockDriver(2, partitions), callbacks2) as client2:
                context = MockContext("extra transaction")
                await client2.submit(context)
                await client2.flush()
                assert await context.result()
                await callbacks2.wait_for_high_water_mark(0, 100)
                assert [t for _, t, _, _ in callbacks2.applied] == list(range(50, 101))
                assert {r.client_id for r in callbacks2.req_ids()} == {1, 2}

    run(go)


def test_concurrency_control_one_of_two_wins() -> None:
    async def go() -> None:
        d1, d2, c1, c2 = await two_clients(MockServerPartition.create(1))
        try:
            ctx1 = MockContext("transaction1", write_locks=[100], retry=False)
            ctx2 = MockContext("transaction2", write_locks=[100], retry=False)
            d1.suspend_feed()
            d2.suspend_feed()
            await c1.submit(ctx1)
            await c2.submit(ctx2)
            d1.resume_feed()
            d2.resume_feed()
            results = await outcomes(ctx1, ctx2)
            assert results[0] ^ results[1]
        finally:
            await c1.close()
            await c2.close()

    run(go)


def test_set_fault_rate() -> None:
    async def go() -> None:
        driver = MockDriver(seed=2)
        driver.set_fault_rate(0.5)
        callbacks = MockCallbacks()
        async with mock_client(driver, callbacks) as client:
            results = []
            for i in range(200):
                context = MockContext(f"transaction{i}", retry=False)
                await client.submit(context)
                await client.flush()
                results.append(await context.result())
            assert 0 < results.count(False) < 200
            await callbacks.wait_for_high_water_mark(0, results.count(True) - 1)
            assert len(callbacks.applied) == results.count(True)

    run(go)


def test_force_next_fail() -> None:
    async def go() -> None:
        driver = MockDriver()
        callbacks = MockCallbacks()
        async with mock_client(driver, callbacks) as client:
            successes = 0
            for i in range(100):
                context = MockContext(f"transaction{i}", retry=False)
                forced = i % 3 == 0
                if forced:
                    driver.force_next_append_fail()
                await client.submit(context)
                await client.flush()
                assert await context.result() is not forced
                if not forced:
                    await callbacks.wait_for_high_water_mark(0, successes)
                    successes += 1

    run(go)


def test_suspend_feed() -> None:
    async def go() -> None:
        n = DEFAULT_MAX_CONCURRENT_TRANSACTIONS
        partitions = MockServerPartition.create(1)
        callbacks1, callbacks2 = MockCallbacks(), MockCallbacks()
        driver2 = MockDriver(2, partitions)
        async with (
            mock_client(MockDriver(1, partitions), callbacks1) as c1,
            mock_client(driver2, callbacks2) as c2,
        ):
            await c2.flush()  # mounted
            driver2.suspend_feed()
            contexts = [MockContext(f"transaction{i}") for i in range(n)]
            for context in contexts:
                await c1.submit(context)
            await c1.flush()
            assert await outcomes(*contexts) == [True] * n
            await callbacks1.wait_for_high_water_mark(0, n - 1)
            # What the suspended client can see right now: nothing of it has arrived.
            await asyncio.sleep(0.05)
            assert callbacks2.get_client_high_water_mark(0) == -1
            driver2.resume_feed()
            context = MockContext("extra transaction")
            await c2.submit(context)
            await c2.flush()
            await callbacks2.wait_for_high_water_mark(0, n)
            assert callbacks2.get_client_high_water_mark(0) == n

    run(go)


def test_data_checksum_errors_are_retried_then_reported() -> None:
    async def go() -> None:
        driver = MockDriver()
        async with mock_client(driver) as client:
            context = MockContext("payload")
            await client.submit(context)
            assert await context.result()
            driver.force_data_checksum_errors(4)  # four bad copies, the fifth is good
            assert await client.rpc_client.get_transaction_data(0, 0) == b"payload"
            driver.force_data_checksum_errors(5)
            try:
                await client.rpc_client.get_transaction_data(0, 0)
            except DataChecksumError as e:
                assert "after 5 attempts" in str(e)
            else:
                raise AssertionError("five bad copies must fail the fetch")

    run(go)


def test_reconnect_remounts_and_resumes_the_feed() -> None:
    async def go() -> None:
        driver = MockDriver()
        callbacks = MockCallbacks()
        client = await WaltzClient.create(
            callbacks, WaltzClientConfig(mock_driver=driver, reconnect_delay_ms=10)
        )
        try:
            for i in range(3):
                await client.submit(MockContext(f"t{i}"))
            await client.flush()
            seq_before = client._stream.network_client_of(0).seq_num  # type: ignore[union-attr]
            driver.disconnect()
            context = MockContext("after reconnect")
            await client.submit(context)
            assert await context.result()
            assert client._stream.network_client_of(0).seq_num == seq_before + 1  # type: ignore[union-attr]
            callbacks.fail_next_apply = 1  # the application fails once: reconnect and apply again
            context = MockContext("applied twice")
            await client.submit(context)
            assert await context.result()
            await asyncio.wait_for(asyncio.wrap_future(context.application), 10)
            assert len(callbacks.uncaught) == 1
            assert [t for _, t, _, _ in callbacks.applied] == list(range(5))
        finally:
            await client.close()

    run(go)
