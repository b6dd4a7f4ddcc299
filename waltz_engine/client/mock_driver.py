"""An in-memory Waltz behind the real client code, for application tests (the original's MockDriver, §3.7).

``MockServerPartition`` plays a server partition with the server's message semantics (mount
feeds the client up to the high-water mark then answers READY or CLIENT_AHEAD, feeds stop
after their fetch size with FEED_SUSPENDED, exact lock map: write and read locks checked,
write and append locks committed). ``MockDriver`` connects a client to a set of them through
in-memory channels, so the stream client, transaction monitor and retry logic that run are
the production ones. Several drivers may share partitions (several clients, one log).

Faults: ``set_fault_rate`` (appends silently dropped at random), ``force_next_append_fail``,
``force_next_lock_fail`` (LockFailure with transaction id -1), ``force_data_checksum_errors``,
``set_max_delay`` (random, order-preserving delay of each request), ``suspend_feed`` /
``resume_feed`` (this client's append outcomes are held back), ``disconnect`` (drop every
connection: the client reconnects and remounts) and ``set_reachable``.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from waltz_engine.client.driver import DriverInfo, OnEndpoints, OnServerRemoved, WaltzClientDriver
from waltz_engine.client.network_client import Endpoint
from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_CLIENT_AHEAD,
    PARTITION_STATE_READY,
    AddPreferredPartitionRequest,
    AddPreferredPartitionResponse,
    AppendRequest,
    CheckStorageConnectivityRequest,
    CheckStorageConnectivityResponse,
    ClientMessage,
    FeedData,
    FeedRequest,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    RemovePreferredPartitionRequest,
    RemovePreferredPartitionResponse,
    ServerPartitionsAssignmentRequest,
    ServerPartitionsAssignmentResponse,
    ServerPartitionsHealthStatRequest,
    ServerPartitionsHealthStatResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from waltz_engine.zk.payloads import PartitionInfo

MOCK_ENDPOINT: Endpoint = "mock:0"
MOCK_CLUSTER_NAME = "mock"
MOCK_GENERATION = 0
DEFAULT_CLIENT_ID = 0
MIN_FETCH_SIZE = 100  # the server's server.minFetchSize default
NO_LOCK_HIGH_WATER_MARK = -1
FORCED_LOCK_FAILURE_TRANSACTION_ID = -1
TRANSACTION_NOT_FOUND = "transaction not found"

# What suspend_feed holds back: everything that tells a client how its appends went.
_HELD_WHILE_SUSPENDED = (FeedData, FeedSuspended, FlushResponse, LockFailure)


class MessageSink(Protocol):
    """Where a server partition sends a connection's answers; callable from any thread."""

    def deliver(self, message: ClientMessage) -> None: ...


@dataclass
class _Feed:
    req_id: ReqId
    next_transaction_id: int
    remaining: int


@dataclass(frozen=True)
class _Record:
    req_id: ReqId
    header: int
    data: bytes


class MockServerPartition:
    """One partition of the in-memory log; thread-safe, so clients on different loops may share it."""

    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id
        self._lock = threading.Lock()
        self._records: list[_Record] = []
        self._locks: dict[int, int] = {}
        self._feeds: dict[MessageSink, _Feed] = {}

    @staticmethod
    def create(num_partitions: int) -> dict[int, MockServerPartition]:
        return {p: MockServerPartition(p) for p in range(num_partitions)}

    @property
    def high_water_mark(self) -> int:
        return len(self._records) - 1

    def transaction_data(self, transaction_id: int) -> bytes:
        return self._records[transaction_id].data

    def detach(self, sink: MessageSink) -> None:
        with self._lock:
            self._feeds.pop(sink, None)

    def handle(
        self,
        sink: MessageSink,
        message: ClientMessage,
        drop: bool = False,
        lock_failure: bool = False,
        corrupt: bool = False,
    ) -> None:
        with self._lock:
            if isinstance(message, AppendRequest):
                self._append(sink, message, drop, lock_failure)
            elif isinstance(message, FeedRequest):
                fetch_size = max(self.high_water_mark - message.client_high_water_mark, MIN_FETCH_SIZE)
                self._feeds[sink] = _Feed(message.req_id, message.client_high_water_mark + 1, fetch_size)
                self._pump(sink)
            elif isinstance(message, MountRequest):
                self._mount(sink, message)
            elif isinstance(message, FlushRequest):
                sink.deliver(FlushResponse(message.req_id, self.high_water_mark))
            elif isinstance(message, TransactionDataRequest):
                sink.deliver(self._data_response(message, corrupt))
            elif isinstance(message, HighWaterMarkRequest):
                sink.deliver(HighWaterMarkResponse(message.req_id, self.high_water_mark))
            else:
                raise AssertionError(f"not a partition request: {message}")

    def _mount(self, sink: MessageSink, message: MountRequest) -> None:
        self._feeds.pop(sink, None)
        if message.client_high_water_mark > self.high_water_mark:
            sink.deliver(MountResponse(message.req_id, PARTITION_STATE_CLIENT_AHEAD))
            return
        # As the server: the mount completes once the client has been fed up to the high-water mark.
        for transaction_id in range(message.client_high_water_mark + 1, self.high_water_mark + 1):
            record = self._records[transaction_id]
            sink.deliver(FeedData(record.req_id, transaction_id, record.header))
        sink.deliver(MountResponse(message.req_id, PARTITION_STATE_READY))

    def _append(self, sink: MessageSink, request: AppendRequest, drop: bool, lock_failure: bool) -> None:
        if drop:
            return  # lost: only a flush (or the nudge) tells the client
        if lock_failure:
            sink.deliver(LockFailure(request.req_id, FORCED_LOCK_FAILURE_TRANSACTION_ID))
            return
        checked = (*(request.write_lock_request or ()), *(request.read_lock_request or ()))
        lock_high_water_mark = max((self._locks.get(h, NO_LOCK_HIGH_WATER_MARK) for h in checked), default=-1)
        if lock_high_water_mark > request.client_high_water_mark:
            sink.deliver(LockFailure(request.req_id, lock_high_water_mark))
            return
        transaction_id = len(self._records)
        self._records.append(_Record(request.req_id, request.header, bytes(request.data or b"")))
        for lock_hash in (*(request.write_lock_request or ()), *(request.append_lock_request or ())):
            self._locks[lock_hash] = transaction_id
        for feed_sink in list(self._feeds):
            self._pump(feed_sink)

    def _pump(self, sink: MessageSink) -> None:
        feed = self._feeds[sink]
        while feed.remaining > 0 and feed.next_transaction_id <= self.high_water_mark:
            record = self._records[feed.next_transaction_id]
            sink.deliver(FeedData(record.req_id, feed.next_transaction_id, record.header))
            feed.next_transaction_id += 1
            feed.remaining -= 1
        if feed.remaining == 0:
            del self._feeds[sink]
            sink.deliver(FeedSuspended(feed.req_id))

    def _data_response(self, request: TransactionDataRequest, corrupt: bool) -> TransactionDataResponse:
        if not 0 <= request.transaction_id <= self.high_water_mark:
            return TransactionDataResponse(
                request.req_id, request.transaction_id, exception_message=TRANSACTION_NOT_FOUND
            )
        data = self._records[request.transaction_id].data
        checksum = crc32(data) ^ 1 if corrupt else crc32(data)
        return TransactionDataResponse(request.req_id, request.transaction_id, data, checksum)


def admin_response(message: ClientMessage, partition_ids: list[int]) -> ClientMessage:
    """The mock's answers to the admin RPCs: one healthy server holding every partition."""
    if isinstance(message, CheckStorageConnectivityRequest):
        return CheckStorageConnectivityResponse(message.req_id, ())
    if isinstance(message, ServerPartitionsAssignmentRequest):
        return ServerPartitionsAssignmentResponse(message.req_id, tuple(partition_ids))
    if isinstance(message, ServerPartitionsHealthStatRequest):
        return ServerPartitionsHealthStatResponse(message.req_id, tuple((p, True) for p in partition_ids))
    if isinstance(message, AddPreferredPartitionRequest):
        return AddPreferredPartitionResponse(message.req_id, True)
    if isinstance(message, RemovePreferredPartitionRequest):
        return RemovePreferredPartitionResponse(message.req_id, True)
    raise AssertionError(f"not an admin request: {message}")


ADMIN_REQUESTS = (
    CheckStorageConnectivityRequest,
    ServerPartitionsAssignmentRequest,
    ServerPartitionsHealthStatRequest,
    AddPreferredPartitionRequest,
    RemovePreferredPartitionRequest,
)


class MockChannel:
    """A client connection to the in-memory partitions; answers come back in order on the client's loop."""

    def __init__(self, driver: MockDriver, loop: asyncio.AbstractEventLoop) -> None:
        self._driver = driver
        self._loop = loop
        self._inbox: asyncio.Queue[ClientMessage | None] = asyncio.Queue()
        self._held: list[ClientMessage] = []
        self._last_due = 0.0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, messages: list[ClientMessage]) -> None:
        if self._closed:
            raise ConnectionClosedError("mock connection is closed")
        max_delay_ms = self._driver.max_delay_ms
        for message in messages:
            if max_delay_ms <= 0:
                self._driver._dispatch(self, message)
                continue
            # Random delay per request, never overtaking an earlier one (one server thread in the original).
            due = max(self._last_due, self._loop.time() + self._driver.random.uniform(0, max_delay_ms) / 1000)
            self._last_due = due
            self._loop.call_at(due, self._dispatch_later, message)

    def _dispatch_later(self, message: ClientMessage) -> None:
        if not self._closed:
            self._driver._dispatch(self, message)

    @property
    def drain_may_wait(self) -> bool:
        return False

    async def drain(self) -> None:
        return None

    async def receive(self) -> ClientMessage | None:
        return await self._inbox.get()

    async def receive_many(self) -> list[ClientMessage] | None:
        message = await self._inbox.get()
        return None if message is None else [message]

    def deliver(self, message: ClientMessage) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._arrive, message)

    def _arrive(self, message: ClientMessage) -> None:
        if self._closed:
            return
        if self._held or (self._driver.feed_suspended and isinstance(message, _HELD_WHILE_SUSPENDED)):
            self._held.append(message)  # everything after a held message waits too: order is kept
        else:
            self._inbox.put_nowait(message)

    def release_held(self) -> None:
        # resume_feed may run on any thread (a test driving a SyncWaltzClient); the inbox is the loop's.
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._release_held)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for message in held:
            self._inbox.put_nowait(message)

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._driver._channels.discard(self)
        for partition in self._driver.partitions.values():
            partition.detach(self)
        self._inbox.put_nowait(None)


class MockDriver(WaltzClientDriver):
    """Pass as ``WaltzClientConfig(mock_driver=...)``; ``partitions`` may be shared by several drivers."""

    def __init__(
        self,
        client_id: int = DEFAULT_CLIENT_ID,
        partitions: Mapping[int, MockServerPartition] | int = 1,
        seed: int | None = None,
    ) -> None:
        self.client_id = client_id
        self.partitions: dict[int, MockServerPartition] = (
            MockServerPartition.create(partitions) if isinstance(partitions, int) else dict(partitions)
        )
        assert sorted(self.partitions) == list(range(len(self.partitions))), "partition ids must be 0..n-1"
        self.random = random.Random(seed)
        self.fault_rate = 0.0
        self.max_delay_ms = 0
        self.feed_suspended = False
        self.reachable = True
        self._force_append_failures = 0
        self._force_lock_failures = 0
        self._force_checksum_errors = 0
        self._channels: set[MockChannel] = set()

    # -- fault injection -------------------------------------------------------------------

    def set_fault_rate(self, fault_rate: float) -> None:
        assert 0.0 <= fault_rate <= 1.0
        self.fault_rate = fault_rate

    def set_max_delay(self, max_delay_ms: int) -> None:
        assert max_delay_ms >= 0
        self.max_delay_ms = max_delay_ms

    def force_next_append_fail(self) -> None:
        self._force_append_failures += 1

    def force_next_lock_fail(self) -> None:
        self._force_lock_failures += 1

    def force_data_checksum_errors(self, count: int) -> None:
        """The next ``count`` transaction data answers carry a wrong CRC-32."""
        self._force_checksum_errors += count

    def suspend_feed(self) -> None:
        self.feed_suspended = True

    def resume_feed(self) -> None:
        self.feed_suspended = False
        for channel in list(self._channels):
            channel.release_held()

    def disconnect(self) -> None:
        """Drop every connection, as a server restart would."""
        for channel in list(self._channels):
            channel.close_now()

    def set_reachable(self, reachable: bool) -> None:
        """False: new connections are refused (existing ones are dropped with ``disconnect``)."""
        self.reachable = reachable

    # -- WaltzClientDriver -----------------------------------------------------------------

    async def start(self, on_endpoints: OnEndpoints, on_server_removed: OnServerRemoved) -> DriverInfo:
        infos = [PartitionInfo(p, MOCK_GENERATION) for p in sorted(self.partitions)]
        asyncio.get_running_loop().call_soon(on_endpoints, {MOCK_ENDPOINT: infos})
        return DriverInfo(self.client_id, MOCK_CLUSTER_NAME, len(self.partitions))

    async def open_channel(self, endpoint: Endpoint) -> MockChannel:
        if not self.reachable:
            raise ConnectionClosedError(f"cannot connect to {endpoint}: the mock server is unreachable")
        channel = MockChannel(self, asyncio.get_running_loop())
        self._channels.add(channel)
        return channel

    async def close(self) -> None:
        self.disconnect()

    def _dispatch(self, channel: MockChannel, message: Any) -> None:
        if isinstance(message, ADMIN_REQUESTS):
            channel.deliver(admin_response(message, sorted(self.partitions)))
            return
        partition = self.partitions[message.req_id.partition_id]
        drop = lock_failure = corrupt = False
        if isinstance(message, AppendRequest):
            if self._force_append_failures:
                self._force_append_failures -= 1
                drop = True
            elif self.fault_rate and self.random.random() < self.fault_rate:
                drop = True
            elif self._force_lock_failures:
                self._force_lock_failures -= 1
                lock_failure = True
        elif isinstance(message, TransactionDataRequest) and self._force_checksum_errors:
            self._force_checksum_errors -= 1
            corrupt = True
        partition.handle(channel, message, drop, lock_failure, corrupt)
