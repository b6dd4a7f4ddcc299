"""A Waltz server stand-in over real TLS sockets speaking the real 'L' codec.

Partition semantics come from the mock driver's ``MockServerPartition``; this adds what a
server does around them (§2.4): partitions it does not own answer MOUNT with NOT_READY and
data requests with an error, appends/feeds/flushes for them are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from waltz_engine.client.mock_driver import ADMIN_REQUESTS, MockServerPartition, admin_response
from waltz_engine.net.channel import FramedConnection, serve
from waltz_engine.net.tls import TlsConfig, server_context
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    PARTITION_STATE_NOT_READY,
    ClientMessage,
    MountRequest,
    MountResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from waltz_engine.wire.hello import SERVER_HELLO_TEXT


class _ConnectionSink:
    def __init__(self, conn: FramedConnection) -> None:
        self.conn = conn

    def deliver(self, message: ClientMessage) -> None:
        if not self.conn.closed:
            self.conn.send_frame(self.conn.codec.encode_frame(message))


class FakeWaltzServer:
    # What answers each connection (a test may write its frames differently: split, joined).
    sink_type: type[_ConnectionSink] = _ConnectionSink

    def __init__(
        self,
        partitions: dict[int, MockServerPartition],
        owned: Iterable[int] | None = None,
        versions: Iterable[int] = tuple(CLIENT_CODECS),
    ) -> None:
        self.partitions = partitions
        self.owned = set(partitions if owned is None else owned)
        self.codecs = {v: CLIENT_CODECS[v] for v in versions}
        self.received: list[ClientMessage] = []
        self.connections: set[FramedConnection] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await serve(
            "127.0.0.1",
            port,
            server_context(TlsConfig()),
            self.codecs,
            SERVER_HELLO_TEXT,
            self._handle,
            "fake-server",
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self.drop_connections()
            await self._server.wait_closed()

    async def drop_connections(self) -> None:
        for conn in list(self.connections):
            await conn.close()

    async def _handle(self, conn: FramedConnection) -> None:
        sink = self.sink_type(conn)
        self.connections.add(conn)
        try:
            while (message := await conn.receive()) is not None:
                self.received.append(message)
                self._dispatch(sink, message)
                await conn.drain()
        finally:
            self.connections.discard(conn)
            for partition in self.partitions.values():
                partition.detach(sink)

    def _dispatch(self, sink: _ConnectionSink, message: ClientMessage) -> None:
        if isinstance(message, ADMIN_REQUESTS):
            sink.deliver(admin_response(message, sorted(self.owned)))
            return
        partition_id = message.req_id.partition_id
        if partition_id in self.owned:
            self.partitions[partition_id].handle(sink, message)
        elif isinstance(message, MountRequest):
            sink.deliver(MountResponse(message.req_id, PARTITION_STATE_NOT_READY))
        elif isinstance(message, TransactionDataRequest):
            sink.deliver(
                TransactionDataResponse(
                    message.req_id, message.transaction_id, exception_message="partition not ready"
                )
            )
