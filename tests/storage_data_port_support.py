"""An in-process storage data port (TLS, real sockets) and a StorageClient opened on it: for the
storage client's own tests, where the test's handler plays the node."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from waltz_engine.net.channel import FramedConnection, serve
from waltz_engine.net.tls import TlsConfig, client_context, server_context
from waltz_engine.storage.client import DEFAULT_REQUEST_TIMEOUT_MS, StorageClient
from waltz_engine.wire.storage_messages import STORAGE_CODEC

TEST_BOUND_S = 30
NUM_PARTITIONS = 4

C = TypeVar("C", bound=StorageClient)


@contextlib.asynccontextmanager
async def client_of_data_port(
    handler: Callable[[FramedConnection], Awaitable[None]],
    client_class: type[C] = StorageClient,  # type: ignore[assignment]
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
) -> AsyncIterator[C]:
    """A ``client_class`` opened (its OPEN's deadline as long as its calls') on a data port
    served by ``handler``; everything closed after, within :data:`TEST_BOUND_S`."""
    server = await serve(
        "127.0.0.1",
        0,
        server_context(TlsConfig()),
        {0: STORAGE_CODEC},
        "Waltz Storage Server",
        handler,
        "test",
    )
    port = server.sockets[0].getsockname()[1]
    client = client_class(
        "127.0.0.1",
        port,
        client_context(TlsConfig()),
        uuid.uuid4(),
        NUM_PARTITIONS,
        request_timeout_ms=request_timeout_ms,
    )
    try:
        async with asyncio.timeout(TEST_BOUND_S):
            await client.open(request_timeout_ms)
            yield client
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
