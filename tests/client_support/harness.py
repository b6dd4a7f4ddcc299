"""Running client tests: a bounded asyncio.run, clients on the mock driver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from client_support.app import MockCallbacks, MockContext
from waltz_engine.client import MockDriver, MockServerPartition, WaltzClient, WaltzClientConfig

TEST_TIMEOUT_S = 120


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), TEST_TIMEOUT_S))


@asynccontextmanager
async def mock_client(
    driver: MockDriver, callbacks: MockCallbacks | None = None, **config: Any
) -> AsyncIterator[WaltzClient]:
    client = await WaltzClient.create(
        callbacks or MockCallbacks(), WaltzClientConfig(mock_driver=driver, **config)
    )
    try:
        yield client
    finally:
        await client.close()


async def two_clients(
    partitions: dict[int, MockServerPartition],
) -> tuple[MockDriver, MockDriver, WaltzClient, WaltzClient]:
    d1, d2 = MockDriver(1, partitions), MockDriver(2, partitions)
    c1 = await WaltzClient.create(MockCallbacks(), WaltzClientConfig(mock_driver=d1))
    c2 = await WaltzClient.create(MockCallbacks(), WaltzClientConfig(mock_driver=d2))
    return d1, d2, c1, c2


async def outcomes(*contexts: MockContext) -> list[bool]:
    return [await c.result() for c in contexts]
