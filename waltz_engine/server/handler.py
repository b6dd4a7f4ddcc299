"""The client port: one handler per connection (reference §2.4, the original's ``WaltzServerHandler``).

The first message sets the connection's client id. Partition requests go to the partition named
by ``reqId.partitionId``; for a partition this server does not own, MOUNT is answered NOT_READY,
TRANSACTION_DATA with the error "partition not ready", and the rest are dropped. Admin requests
(13-22) are answered here.

Back pressure: the handler reads the next request only after the previous one was handed over
(a full append queue stops reading) and only while the connection's write buffer is below its
high-water mark, so a client that does not read stops being read, as Netty's auto-read toggling
does. Requests that wait on storage or ZooKeeper run as tasks, at most
``MAX_PENDING_RPCS_PER_CONNECTION`` per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from waltz_engine.auth.acl import ADMIN, APPEND, NO_PARTITION, READ
from waltz_engine.auth.authorizer import Authorizer
from waltz_engine.common.loop_turns import call_before_select
from waltz_engine.net.channel import WRITE_BUFFER_HIGH_BYTES, ConnectionClosedError, FramedConnection
from waltz_engine.server.feeds import FeedContext
from waltz_engine.server.partition import Partition
from waltz_engine.server.partition_data import DataLoad
from waltz_engine.wire.client_messages import (
    AUTHORIZATION_VERSION,
    AUTHORIZING_CLIENT_CODEC,
    PARTITION_STATE_NOT_READY,
    AddPreferredPartitionRequest,
    AddPreferredPartitionResponse,
    AppendRequest,
    AuthorizationFailure,
    CheckStorageConnectivityRequest,
    CheckStorageConnectivityResponse,
    FeedRequest,
    FlushRequest,
    HighWaterMarkRequest,
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
    recognise_append_request,
)

log = logging.getLogger(__name__)

MAX_PENDING_RPCS_PER_CONNECTION = 100
# Data requests of one connection waiting on storage reads; past it the handler stops reading
# the connection until some are answered (cache hits are answered at once and never count).
MAX_PENDING_DATA_REQUESTS_PER_CONNECTION = 1_000
PARTITION_NOT_READY = "partition not ready"


class ServerServices(Protocol):
    """What a connection needs from the server (implemented by ``server.ServerCore``)."""

    def partition(self, partition_id: int) -> Partition | None: ...

    def partition_ids(self) -> list[int]: ...

    def partitions_health(self) -> dict[int, bool]: ...

    async def check_storage_connectivity(self) -> dict[str, bool]: ...

    async def add_preferred_partitions(self, partition_ids: tuple[int, ...]) -> bool: ...

    async def remove_preferred_partitions(self, partition_ids: tuple[int, ...]) -> bool: ...


class ClientConnection:
    """A client connection as partitions and feeds see it (``feeds.FeedClient``)."""

    __slots__ = (
        "conn",
        "codec",
        "client_id",
        "_parked",
        "_drainer",
        "_loop",
        "_feeds",
        "_feeds_bytes",
        "_rpc_slots",
        "_rpcs",
        "_data_requests",
        "_data_loading",
        "_data_room",
        "principal",
        "reading",
        "revoked",
    )

    def __init__(self, conn: FramedConnection) -> None:
        self.conn = conn
        self.codec = conn.codec
        self.client_id: int | None = None
        # With the authorizer on: who the client is, and the partitions it mounted (by the
        # MOUNT's reqId), checked again when the ACLs change.
        self.principal: str | None = None
        self.reading: dict[int, Any] = {}
        # Partitions whose read was revoked while this connection stays open: their feeds end.
        self.revoked: set[int] = set()
        self._parked: list[FeedContext] = []
        self._drainer: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        # Feed frames sent in this loop turn, written together at its end (before the loop's
        # next ``select``): the feeds of the partitions a turn committed (16 partitions: 3-4
        # batches a turn) go to this client in one write, one TLS record to send and to read.
        self._feeds: list[bytes | memoryview] = []
        self._feeds_bytes = 0
        self._rpc_slots = asyncio.Semaphore(MAX_PENDING_RPCS_PER_CONNECTION)
        self._rpcs: set[asyncio.Task[None]] = set()
        # TRANSACTION_DATA_REQUESTs read since the last answer: answered together once the reader
        # has taken every request that arrived (a callback after this turn of the loop).
        self._data_requests: list[tuple[Partition, TransactionDataRequest]] = []
        self._data_loading = 0
        self._data_room = asyncio.Event()
        self._data_room.set()

    @property
    def version(self) -> int:
        return self.codec.version

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def write_buffer_size_bytes(self) -> int:
        return self.conn.write_buffer_bytes()

    def writable(self) -> bool:
        # The feeds not written yet count: the bound is the same as when each went at once.
        # (``closed`` and ``write_buffer_size_bytes`` inline: every commit's feed asks.)
        conn = self.conn
        return not conn.closed and conn.write_buffer_bytes() + self._feeds_bytes <= WRITE_BUFFER_HIGH_BYTES

    def send(self, message: Any) -> None:
        self.send_frame(self.codec.encode_frame(message))

    def send_frame(self, frame: bytes) -> None:
        if self._feeds:
            self._write_feeds()  # what was sent before it goes before it
        # A response to a client that is gone has nobody to go to.
        with contextlib.suppress(ConnectionClosedError):
            self.conn.send_frame(frame)

    def send_feed(self, frames: memoryview, terminal: Any | None) -> None:
        """``frames`` (a slice of the partition's shared frames, not copied until written) and
        ``terminal``, written with every other feed of this loop turn, at its end: in order with
        everything else sent to the client (which writes what waits first)."""
        if self.conn.closed:
            return  # a feed to a client that is gone has nobody to go to
        feeds = self._feeds
        if not feeds:
            call_before_select(self._loop, self._write_feeds)
        feeds.append(frames)
        self._feeds_bytes += len(frames)
        if terminal is not None:
            frame = self.codec.encode_frame(terminal)
            feeds.append(frame)
            self._feeds_bytes += len(frame)

    def _write_feeds(self) -> None:
        """The feeds sent since the last write, in one write (over TLS one record to send)."""
        feeds, self._feeds = self._feeds, []
        self._feeds_bytes = 0
        if feeds and not self.conn.closed:
            self.conn.writer.write(feeds[0] if len(feeds) == 1 else b"".join(feeds))

    def disconnect(self) -> None:
        self._write_feeds()
        self.conn.writer.close()

    def park(self, context: FeedContext) -> None:
        """Holds a feed until the write buffer drains; one drain task per connection at most."""
        self._write_feeds()  # the buffer the drain waits for holds them
        self._parked.append(context)
        if self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain_and_resume())

    def num_parked(self) -> int:
        return len(self._parked)

    async def _drain_and_resume(self) -> None:
        try:
            await self.conn.drain()
        except ConnectionClosedError:
            self._parked.clear()
            return
        finally:
            self._drainer = None
        parked, self._parked = self._parked, []
        for context in parked:
            context.resume(context)

    async def run_rpc(self, work: Callable[[], Awaitable[Any]]) -> None:
        """Answers a request that waits on storage or ZooKeeper without blocking the reading."""
        await self._rpc_slots.acquire()

        async def go() -> None:
            try:
                response = await work()
                self.send(response)
            finally:
                self._rpc_slots.release()

        task = asyncio.get_running_loop().create_task(go())
        self._rpcs.add(task)
        task.add_done_callback(self._rpc_done)

    async def transaction_data(self, partition: Partition, request: TransactionDataRequest) -> None:
        """Queues a data request; the burst it arrived in is answered in one go."""
        requests = self._data_requests
        requests.append((partition, request))
        if len(requests) == 1:
            asyncio.get_running_loop().call_soon(self._answer_data_requests)
        if not self._data_room.is_set():
            await self._data_room.wait()

    def _answer_data_requests(self) -> None:
        """Cache hits in one write; each partition's misses read in ranges and answered together."""
        burst, self._data_requests = self._data_requests, []
        if self.closed:
            return
        by_partition: dict[Partition, list[TransactionDataRequest]] = {}
        for partition, request in burst:
            by_partition.setdefault(partition, []).append(request)
        encode = self.codec.encode_frame
        frames: list[bytes] = []
        for partition, requests in by_partition.items():
            answers, loading = partition.transaction_data_many(requests)
            frames.extend([encode(answer) for answer in answers])
            if loading:
                self._data_loading += len(loading)
                if self._data_loading >= MAX_PENDING_DATA_REQUESTS_PER_CONNECTION:
                    self._data_room.clear()
                task = asyncio.get_running_loop().create_task(self._answer_loads(partition, loading))
                self._rpcs.add(task)
                task.add_done_callback(self._rpc_done)
        if frames:
            self.send_frames(frames)

    async def _answer_loads(
        self,
        partition: Partition,
        loading: list[DataLoad],
    ) -> None:
        try:
            encode = self.codec.encode_frame
            frames = [encode(await partition.data_response(request, pending)) for request, pending in loading]
            self.send_frames(frames)
        finally:
            self._data_loading -= len(loading)
            if self._data_loading < MAX_PENDING_DATA_REQUESTS_PER_CONNECTION:
                self._data_room.set()

    def send_frames(self, frames: list[bytes]) -> None:
        if self._feeds:
            self._write_feeds()  # what was sent before them goes before them
        # One write for the lot: over TLS one flush to the socket.
        with contextlib.suppress(ConnectionClosedError):
            self.conn.send_frames(frames)

    def _rpc_done(self, task: asyncio.Task[None]) -> None:
        self._rpcs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("client %s: request failed", self.client_id, exc_info=task.exception())

    async def close(self) -> None:
        tasks = list(self._rpcs)
        if self._drainer is not None:
            tasks.append(self._drainer)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._parked.clear()
        self._feeds.clear()
        self._feeds_bytes = 0


_TYPE_CODES = {spec.cls: spec.type_code for spec in AUTHORIZING_CLIENT_CODEC.specs}
# A FLUSH writes nothing and tells what a mount tells (the appends sent before it are decided, the
# high-water mark): a read. As an append, a reader whose append was lost with its connection
# (never refused, never decided) asked about it without end.
_READS = (MountRequest, FeedRequest, TransactionDataRequest, HighWaterMarkRequest, FlushRequest)
_APPENDS = (AppendRequest,)
_PREFERRED = (AddPreferredPartitionRequest, RemovePreferredPartitionRequest)
NOT_AUTHORIZED = "not authorized"


class ClientHandler:
    """``net.serve`` handler for the client port; with an ``authorizer``, every request is checked
    against the ACLs before it is served (issue 34)."""

    def __init__(self, services: ServerServices, authorizer: Authorizer | None = None) -> None:
        self.services = services
        self.connections: set[ClientConnection] = set()
        self.authorizer = authorizer
        if authorizer is not None:
            authorizer.on_change(self._recheck_reads)

    async def __call__(self, conn: FramedConnection) -> None:
        """Requests are cut and handled in the connection's read callback; an append that needs
        no waiting is sent to storage from there (no task turn). Anything else, and everything
        read after it, goes in order to this task, reading paused until it is through (the
        pull-based back pressure: a full queue or write buffer stops the reading)."""
        client = ClientConnection(conn)
        self.connections.add(client)
        authorizer = self.authorizer
        if authorizer is not None:
            client.principal = authorizer.principal_of(conn, "server client port")

        services = self.services

        def now(message: Any) -> bool:
            """Handle ``message`` in this call if that needs no waiting (an append); False: queue it."""
            if client.client_id is None:
                client.client_id = message.req_id.client_id
            if type(message) is not AppendRequest:
                return False  # served in order by ``later``
            if authorizer is not None and not self._authorized(authorizer, client, message):
                return True  # refused, and answered
            partition = services.partition(message.req_id.partition_id)
            return partition is None or partition.append_now(client, message)

        async def later(message: Any) -> None:
            if client.client_id is None:
                client.client_id = message.req_id.client_id
            if authorizer is not None and not self._authorized(authorizer, client, message):
                return
            await self._dispatch(client, message)

        try:
            # An append without locks, read whole, is decoded by its bytes (no frame decoder).
            await conn.handle(now, later, partial(recognise_append_request, version=client.version))
        finally:
            self.connections.discard(client)
            for partition_id in self.services.partition_ids():
                partition = self.services.partition(partition_id)
                if partition is not None:
                    partition.remove_client(client, client.client_id)
            await client.close()

    def _authorized(self, authorizer: Authorizer, client: ClientConnection, message: Any) -> bool:
        """Whether the ACLs allow ``message``; a refusal is answered here (see :meth:`_refuse`)."""

        kind = type(message)
        partition_id = message.req_id.partition_id
        if kind in _READS:
            operation, partitions = READ, (partition_id,)
        elif kind in _APPENDS:
            operation, partitions = APPEND, (partition_id,)
        elif kind in _PREFERRED:
            operation, partitions = ADMIN, tuple(message.partition_ids or ()) or (NO_PARTITION,)
        else:
            operation, partitions = ADMIN, (NO_PARTITION,)
        name = kind.__name__
        for partition in partitions:
            if not authorizer.check(client.principal, operation, partition, name, client.conn.peer):
                self._refuse(client, message, operation, partition)
                return False
        if kind is MountRequest:
            client.reading[partition_id] = message.req_id
            client.revoked.discard(partition_id)
        return True

    @staticmethod
    def _refuse(client: ClientConnection, message: Any, operation: str, partition_id: int) -> None:
        """Tell a v5 client (AUTHORIZATION_FAILURE). The original's versions have no refusal a Java
        client stops on: a MOUNT is answered NOT_READY (it retries), a TRANSACTION_DATA with an
        error (it retries), the rest are dropped as for a partition the server does not own."""
        req_id = message.req_id
        if client.version >= AUTHORIZATION_VERSION:
            client.send(
                AuthorizationFailure(
                    req_id, _TYPE_CODES[type(message)], operation, partition_id, client.principal
                )
            )
        elif isinstance(message, MountRequest):
            client.send(MountResponse(req_id, PARTITION_STATE_NOT_READY))
        elif isinstance(message, TransactionDataRequest):
            client.send(
                TransactionDataResponse(req_id, message.transaction_id, exception_message=NOT_AUTHORIZED)
            )

    def _recheck_reads(self) -> None:
        """After an ACL change: a mount (and so its feed) whose read was revoked ends. A v5 client
        is told, for that partition; an older one loses the connection (and remounts, refused)."""
        authorizer = self.authorizer
        assert authorizer is not None

        for client in list(self.connections):
            for partition_id, req_id in list(client.reading.items()):
                if authorizer.check(client.principal, READ, partition_id, "FeedRequest", client.conn.peer):
                    continue
                del client.reading[partition_id]
                client.revoked.add(partition_id)  # its feed contexts end where the workers reach them
                partition = self.services.partition(partition_id)
                if partition is not None:
                    partition.remove_client(client, client.client_id)
                if client.version >= AUTHORIZATION_VERSION:
                    code = _TYPE_CODES[FeedRequest]
                    client.send(AuthorizationFailure(req_id, code, READ, partition_id, client.principal))
                else:
                    client.disconnect()
                    break

    async def _dispatch(self, client: ClientConnection, message: Any) -> None:
        req_id = message.req_id
        if isinstance(message, (MountRequest, AppendRequest, FeedRequest, FlushRequest)):
            partition = self.services.partition(req_id.partition_id)
            if partition is None:
                if isinstance(message, MountRequest):
                    client.send(MountResponse(req_id, PARTITION_STATE_NOT_READY))
                return
            if isinstance(message, AppendRequest):
                await partition.append(client, message)
            elif isinstance(message, MountRequest):
                await partition.mount(client, message)
            elif isinstance(message, FeedRequest):
                await partition.feed(client, message)
            else:
                await partition.flush(client, message)
        elif isinstance(message, TransactionDataRequest):
            partition = self.services.partition(req_id.partition_id)
            if partition is None:
                client.send(
                    TransactionDataResponse(
                        req_id, message.transaction_id, exception_message=PARTITION_NOT_READY
                    )
                )
                return
            # Through the fetcher even when cached: it counts the cache misses, once.
            await client.transaction_data(partition, message)
        elif isinstance(message, HighWaterMarkRequest):
            partition = self.services.partition(req_id.partition_id)
            # Not listed by the original's partitionNotFound: dropped like APPEND/FEED/FLUSH.
            if partition is not None:
                await partition.high_water_mark_request(client, message)
        else:
            await self._admin(client, message)

    async def _admin(self, client: ClientConnection, message: Any) -> None:
        services = self.services
        req_id = message.req_id
        if isinstance(message, ServerPartitionsAssignmentRequest):
            client.send(ServerPartitionsAssignmentResponse(req_id, tuple(services.partition_ids())))
        elif isinstance(message, ServerPartitionsHealthStatRequest):
            stats = tuple(sorted(services.partitions_health().items()))
            client.send(ServerPartitionsHealthStatResponse(req_id, stats))
        elif isinstance(message, CheckStorageConnectivityRequest):

            async def connectivity() -> CheckStorageConnectivityResponse:
                found = await services.check_storage_connectivity()
                return CheckStorageConnectivityResponse(req_id, tuple(sorted(found.items())))

            await client.run_rpc(connectivity)
        elif isinstance(message, AddPreferredPartitionRequest):
            ids = message.partition_ids

            async def add() -> AddPreferredPartitionResponse:
                return AddPreferredPartitionResponse(req_id, await services.add_preferred_partitions(ids))

            await client.run_rpc(add)
        elif isinstance(message, RemovePreferredPartitionRequest):
            ids = message.partition_ids

            async def remove() -> RemovePreferredPartitionResponse:
                return RemovePreferredPartitionResponse(
                    req_id, await services.remove_preferred_partitions(ids)
                )

            await client.run_rpc(remove)
        else:
            # Responses (types a client sends only by mistake) are logged and ignored.
            log.warning("client %s: unexpected %s ignored", client.client_id, type(message).__name__)
