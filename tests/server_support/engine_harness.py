"""A server core over the fake store on a real TLS port, and a raw protocol client for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from server_support.fake_store import FakeStore

from waltz_engine.common.crc import crc32
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import FramedConnection, connect, serve
from waltz_engine.net.tls import TlsConfig, client_context, server_context
from waltz_engine.server.config import EngineSettings
from waltz_engine.server.handler import ClientHandler
from waltz_engine.server.server import ServerCore
from waltz_engine.wire.client_messages import CLIENT_CODECS, NO_LOCKS, AppendRequest
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT, SERVER_HELLO_TEXT
from waltz_engine.zk.payloads import PartitionInfo

RECEIVE_TIMEOUT_S = 10.0
GENERATION = 1


class Harness:
    def __init__(self, core: ServerCore, store: FakeStore, handler: ClientHandler, port: int) -> None:
        self.core = core
        self.store = store
        self.handler = handler
        self.port = port

    async def client(self, version: int = 4) -> TestClient:
        conn = await connect(
            "127.0.0.1",
            self.port,
            client_context(TlsConfig()),
            {version: CLIENT_CODECS[version]},
            CLIENT_HELLO_TEXT,
        )
        return TestClient(conn)


class TestClient:
    __test__ = False  # not a pytest class

    def __init__(self, conn: FramedConnection) -> None:
        self.conn = conn

    async def send(self, message: Any) -> None:
        await self.conn.send(message)

    async def receive(self, timeout_s: float = RECEIVE_TIMEOUT_S) -> Any:
        return await asyncio.wait_for(self.conn.receive(), timeout_s)

    async def receive_until(self, kind: type, timeout_s: float = RECEIVE_TIMEOUT_S) -> list[Any]:
        """Every message up to and including the first of type ``kind``."""
        got: list[Any] = []
        while True:
            message = await self.receive(timeout_s)
            assert message is not None, f"connection closed after {got}"
            got.append(message)
            if isinstance(message, kind):
                return got

    async def close(self) -> None:
        await self.conn.close()


def req(client_id: int, seq: int, partition_id: int = 0, generation: int = GENERATION) -> ReqId:
    return ReqId(client_id, generation, partition_id, seq)


def append(
    req_id: ReqId,
    client_hwm: int,
    data: bytes = b"data",
    write: tuple[int, ...] = NO_LOCKS,
    read: tuple[int, ...] = NO_LOCKS,
    append_locks: tuple[int, ...] = NO_LOCKS,
    header: int = 0,
) -> AppendRequest:
    return AppendRequest(req_id, client_hwm, write, read, append_locks, header, data, crc32(data))


@asynccontextmanager
async def running_core(
    num_partitions: int = 2,
    owned: tuple[int, ...] = (0,),
    settings: EngineSettings | None = None,
) -> AsyncIterator[Harness]:
    store = FakeStore(num_partitions)
    core = ServerCore(
        store,
        settings or EngineSettings(feed_cache_size_bytes=1 << 20, transaction_data_cache_size_bytes=1 << 20),
        MetricsRegistry(),
    )
    handler = ClientHandler(core)
    server = await serve(
        "127.0.0.1", 0, server_context(TlsConfig()), CLIENT_CODECS, SERVER_HELLO_TEXT, handler, "test server"
    )
    await core.set_partitions([PartitionInfo(pid, GENERATION) for pid in owned])
    try:
        yield Harness(core, store, handler, server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await core.close()


# Waits in the engine tests poll every WAIT_STEP_S, for at most MAX_WAIT_STEPS steps (30 s).
WAIT_STEP_S = 0.01
MAX_WAIT_STEPS = 3000


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(MAX_WAIT_STEPS):
        if condition():
            return
        await asyncio.sleep(WAIT_STEP_S)
    raise AssertionError(f"timed out waiting until {what}")


def run(test: Callable[[Harness], Awaitable[None]], **kwargs: Any) -> None:
    """Run ``test`` against a fresh core (``running_core``'s keyword arguments pass through)."""

    async def go() -> None:
        async with running_core(**kwargs) as harness:
            await test(harness)

    asyncio.run(go())
