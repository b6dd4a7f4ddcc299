"""The stream connection's feed handled in its read callback (issue 33), over real TLS sockets.

A plain ``apply_transaction`` runs in the transport's read callback (no task: ``current_task()``
is None); one that returns something to await, and everything after it, goes to the
connection's reader task in order, as before. These tests pin what must not change: the order
of application, a callback that raises, a callback that fetches data, and back pressure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from client_support.app import STRINGS, MockContext
from client_support.fake_server import FakeWaltzServer, _ConnectionSink
from client_support.harness import run
from client_support.static_driver import StaticDriver

from waltz_engine.client import (
    MockServerPartition,
    Transaction,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_engine.client.channel import FramedChannel
from waltz_engine.client.partition import ApplicationLock
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import STREAM_READ_LIMIT_BYTES
from waltz_engine.net.transport import StreamReader
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_READY,
    ClientMessage,
    FeedData,
    MountRequest,
    MountResponse,
)
from waltz_engine.zk.payloads import PartitionInfo

FAST = {"not_ready_retry_ms": 50, "reconnect_delay_ms": 50}
OTHER_CLIENT = 99  # the writer of the scripted feeds' transactions (never registered here)


class Recorder(WaltzClientCallbacks):
    """Applies in order; ``slow`` / ``fail_once`` / ``fetch`` pick what a transaction's
    callback does. Records (partition, txid, ran in a task) per application."""

    def __init__(self) -> None:
        self.hwm: dict[int, int] = {}
        self.applied: list[tuple[int, int, bool]] = []
        self.events: list[str] = []
        self.uncaught: list[tuple[int, int, BaseException]] = []
        self.slow: dict[tuple[int, int], Callable[[], Awaitable[None]]] = {}
        self.fail_once: set[tuple[int, int]] = set()
        self.fetch: set[tuple[int, int]] = set()
        self.data: dict[int, str] = {}
        self.changed = asyncio.Event()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm.get(partition_id, -1)

    def _applied(self, transaction: Transaction) -> None:
        key = (transaction.partition_id, transaction.transaction_id)
        assert transaction.transaction_id == self.get_client_high_water_mark(key[0]) + 1, "out of order"
        self.hwm[key[0]] = key[1]
        self.applied.append((*key, asyncio.current_task() is not None))
        self.events.append(f"end {key}")
        self.changed.set()

    def apply_transaction(self, transaction: Transaction) -> Awaitable[None] | None:
        key = (transaction.partition_id, transaction.transaction_id)
        self.events.append(f"start {key}")
        if key in self.fail_once:
            self.fail_once.discard(key)
            raise RuntimeError(f"application failure at {key} (injected)")
        wait = self.slow.pop(key, None)
        if key in self.fetch:
            return self._fetch_then_apply(transaction)
        if wait is not None:
            return self._wait_then_apply(wait, transaction)
        self._applied(transaction)
        return None

    async def _wait_then_apply(self, wait: Callable[[], Awaitable[None]], transaction: Transaction) -> None:
        await wait()
        self._applied(transaction)

    async def _fetch_then_apply(self, transaction: Transaction) -> None:
        self.data[transaction.transaction_id] = await transaction.data(STRINGS)
        self._applied(transaction)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.uncaught.append((partition_id, transaction_id, exception))

    async def wait_for(self, partition_id: int, target: int, timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while self.get_client_high_water_mark(partition_id) < target:
                self.changed.clear()
                await self.changed.wait()


async def started(
    server: FakeWaltzServer, callbacks: Recorder, partitions: int = 1, **config: Any
) -> WaltzClient:
    await server.start()
    infos = [PartitionInfo(p, 1) for p in range(partitions)]
    driver = StaticDriver({server.endpoint: infos}, partitions)
    return await WaltzClient.create(callbacks, WaltzClientConfig(mock_driver=driver, **{**FAST, **config}))


def test_plain_callbacks_apply_in_the_read_callback_and_a_slow_one_keeps_the_order() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(2))
        callbacks = Recorder()
        release = asyncio.Event()

        async def held() -> None:
            await release.wait()

        # The 4th transaction of partition 0 waits; partition 1's feed shares the connection.
        callbacks.slow[(0, 3)] = held
        # Room for every append: partition 1's feed waits behind partition 0's held one.
        client = await started(server, callbacks, partitions=2, max_concurrent_transactions=20)
        try:
            contexts = [MockContext(f"t{i}", partition=i % 2) for i in range(20)]
            for context in contexts[:10]:
                await client.submit(context)
            await callbacks.wait_for(0, 2)
            await callbacks.wait_for(1, 2)
            for context in contexts[10:]:
                await client.submit(context)
            await asyncio.sleep(0.2)  # everything after the held one arrives, and waits behind it
            assert callbacks.get_client_high_water_mark(0) == 2
            assert callbacks.events[-1] == "start (0, 3)"
            release.set()
            await client.flush()
            assert all([await c.result() for c in contexts])
            for partition_id in (0, 1):
                assert [t for p, t, _ in callbacks.applied if p == partition_id] == list(range(10))
            # Before the held one every callback ran in the read callback; the held one finished on the task.
            before = callbacks.applied[: callbacks.applied.index((0, 3, True))]
            assert before and not any(in_task for _, _, in_task in before)
            # Once its backlog is through, plain callbacks run in the read callback again.
            after = MockContext("after")
            await client.submit(after)
            assert await after.result()
            await callbacks.wait_for(0, 10)
            assert callbacks.applied[-1] == (0, 10, False)
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_a_callback_raising_in_the_read_callback_drops_the_connection_and_is_fed_again() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        callbacks = Recorder()
        callbacks.fail_once.add((0, 2))
        client = await started(server, callbacks)
        try:
            contexts = [MockContext(f"t{i}") for i in range(6)]
            for context in contexts:
                await client.submit(context)
            await callbacks.wait_for(0, 5)
            await client.flush()
            assert all([await c.result() for c in contexts])
            assert [t for _, t, _ in callbacks.applied] == list(range(6))
            assert [(p, t, type(e)) for p, t, e in callbacks.uncaught] == [(0, 2, RuntimeError)]
            assert client._stream_client().reconnects == 1
            # The failed one's context still hears of its application, once, after the refeed.
            assert contexts[2].events == ["completion:True", "application"]
            # The failure itself was met in the read callback (no task), as the ones before it.
            assert callbacks.events.index("start (0, 2)") < callbacks.events.index("end (0, 2)")
            assert not any(in_task for _, t, in_task in callbacks.applied if t < 2)
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_a_callback_that_fetches_data_waits_on_the_task_in_order() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        callbacks = Recorder()
        callbacks.fetch.update({(0, 1), (0, 2)})
        client = await started(server, callbacks)
        try:
            contexts = [MockContext(f"data-{i}") for i in range(5)]
            for context in contexts:
                await client.submit(context)
            await client.flush()
            await callbacks.wait_for(0, 4)
            assert [t for _, t, _ in callbacks.applied] == list(range(5))
            assert callbacks.data == {1: "data-1", 2: "data-2"}
            in_task = {t: task for _, t, task in callbacks.applied}
            assert in_task[0] is False and in_task[1] is True and in_task[2] is True
        finally:
            await client.close()
            await server.stop()

    run(go)


class ScriptedFeedServer(FakeWaltzServer):
    """Answers a mount with a scripted feed written at once (one write), then READY."""

    def __init__(self, feed: Callable[[Any], bytes]) -> None:
        super().__init__(MockServerPartition.create(1))
        self._feed = feed

    def _dispatch(self, sink: _ConnectionSink, message: ClientMessage) -> None:
        if isinstance(message, MountRequest):
            conn = sink.conn
            conn.send_frame(
                self._feed(conn.codec)
                + conn.codec.encode_frame(MountResponse(message.req_id, PARTITION_STATE_READY))
            )
            return
        super()._dispatch(sink, message)


def test_a_waiting_callback_stops_the_reading_as_the_reader_task_did() -> None:
    """While a callback waits, the bytes that follow fill the stream reader up to its limit and
    no further: reading pauses (TCP's flow control reaches the server), as on the task path."""

    async def go() -> None:
        def feed(codec: Any) -> bytes:
            def frame(transaction_id: int) -> bytes:
                return bytes(codec.encode_frame(FeedData(ReqId(OTHER_CLIENT, 1, 0, 1), transaction_id, 0)))

            # Transaction 0, then 3 MiB of copies of it (duplicates: skipped), then 1 and 2.
            copies = 3 * STREAM_READ_LIMIT_BYTES // len(frame(0))
            return frame(0) + frame(0) * copies + frame(1) + frame(2)

        server = ScriptedFeedServer(feed)
        callbacks = Recorder()
        release = asyncio.Event()
        entered = asyncio.Event()

        async def held() -> None:
            entered.set()
            await release.wait()

        callbacks.slow[(0, 0)] = held
        client = await started(server, callbacks)
        try:
            await asyncio.wait_for(entered.wait(), 20)
            network_client = client._stream_client().network_client_of(0)
            assert network_client is not None
            channel = network_client._channel
            assert isinstance(channel, FramedChannel)
            reader = channel._conn.reader
            assert isinstance(reader, StreamReader)
            transport = channel._conn.writer.transport
            async with asyncio.timeout(20):
                while transport.is_reading():
                    await asyncio.sleep(0.01)
            buffered = reader.buffered_bytes
            await asyncio.sleep(0.2)
            assert not transport.is_reading()
            assert reader.buffered_bytes == buffered  # nothing more is read while it waits
            assert 2 * STREAM_READ_LIMIT_BYTES < buffered <= 3 * STREAM_READ_LIMIT_BYTES
            assert callbacks.applied == []
            release.set()
            await callbacks.wait_for(0, 2)
            assert [t for _, t, _ in callbacks.applied] == [0, 1, 2]
            await client.ensure_mounted(0)
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_the_application_lock_is_taken_in_order() -> None:
    async def go() -> None:
        lock = ApplicationLock()
        assert lock.try_acquire()
        assert not lock.try_acquire()
        order: list[str] = []

        async def waiter(name: str) -> None:
            await lock.acquire()
            order.append(name)
            lock.release()

        first = asyncio.create_task(waiter("first"))
        cancelled = asyncio.create_task(waiter("cancelled"))
        last = asyncio.create_task(waiter("last"))
        await asyncio.sleep(0)
        cancelled.cancel()
        lock.release()  # handed to the first waiter: a synchronous try still cannot pass it
        assert not lock.try_acquire()
        await asyncio.gather(first, last, return_exceptions=True)
        assert order == ["first", "last"]
        assert cancelled.cancelled()
        assert lock.try_acquire()
        lock.release()

    run(go)
