"""pytest fixture ``waltz_mock_client``: Waltz clients on the in-memory mock driver for application tests.

Register with the entry point (pyproject.toml)::

    [project.entry-points.pytest11]
    waltz_client = "waltz_engine.client.pytest_plugin"

(or ``pytest_plugins = ["waltz_engine.client.pytest_plugin"]`` in a conftest.py).

    def test_my_app(waltz_mock_client):
        client = waltz_mock_client.client(MyCallbacks())          # a SyncWaltzClient
        waltz_mock_client.driver.force_next_lock_fail()           # faults on the first client's driver
        async_client = await waltz_mock_client.async_client(cb)   # inside a running event loop
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from waltz_engine.client.callbacks import WaltzClientCallbacks
from waltz_engine.client.client import WaltzClient
from waltz_engine.client.config import WaltzClientConfig
from waltz_engine.client.mock_driver import MockDriver, MockServerPartition
from waltz_engine.client.sync_client import SyncWaltzClient

DEFAULT_NUM_PARTITIONS = 1


class WaltzMockHarness:
    """Mock partitions shared by every client made here; each client gets its own driver (and id)."""

    def __init__(self, num_partitions: int = DEFAULT_NUM_PARTITIONS) -> None:
        self.partitions = MockServerPartition.create(num_partitions)
        self.drivers: list[MockDriver] = []
        self._sync_clients: list[SyncWaltzClient] = []
        self._async_clients: list[WaltzClient] = []

    @property
    def driver(self) -> MockDriver:
        """The first client's driver (made on demand): where faults are injected."""
        if not self.drivers:
            self.new_driver()
        return self.drivers[0]

    def new_driver(self) -> MockDriver:
        driver = MockDriver(len(self.drivers) + 1, self.partitions)
        self.drivers.append(driver)
        return driver

    def _config(self, driver: MockDriver | None, options: dict[str, Any]) -> WaltzClientConfig:
        if driver is None:
            driver = self.driver if not self._clients_made else self.new_driver()
        return WaltzClientConfig(mock_driver=driver, **options)

    @property
    def _clients_made(self) -> int:
        return len(self._sync_clients) + len(self._async_clients)

    def client(
        self, callbacks: WaltzClientCallbacks, driver: MockDriver | None = None, **options: Any
    ) -> SyncWaltzClient:
        """A blocking client; ``options`` are WaltzClientConfig fields (auto_mount=False, ...)."""
        client = SyncWaltzClient(callbacks, self._config(driver, options))
        self._sync_clients.append(client)
        return client

    async def async_client(
        self, callbacks: WaltzClientCallbacks, driver: MockDriver | None = None, **options: Any
    ) -> WaltzClient:
        """An asyncio client on the running loop; close it before the loop ends (or let teardown try)."""
        client = await WaltzClient.create(callbacks, self._config(driver, options))
        self._async_clients.append(client)
        return client

    def close(self) -> None:
        for client in self._sync_clients:
            client.close()


@pytest.fixture
def waltz_mock_client() -> Iterator[WaltzMockHarness]:
    harness = WaltzMockHarness()
    try:
        yield harness
    finally:
        harness.close()
