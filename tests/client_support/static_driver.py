"""A real-network driver with fixed endpoints: the client's TLS/codec path without ZooKeeper."""

from __future__ import annotations

from waltz_engine.client.channel import Channel
from waltz_engine.client.driver import (
    DriverInfo,
    OnEndpoints,
    OnServerRemoved,
    WaltzClientDriver,
    open_framed_channel,
)
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.zk.payloads import PartitionInfo


class StaticDriver(WaltzClientDriver):
    def __init__(
        self, endpoints: dict[str, list[PartitionInfo]], num_partitions: int, client_id: int = 7
    ) -> None:
        self.endpoints = endpoints
        self.num_partitions = num_partitions
        self.client_id = client_id
        self._ssl = client_context(TlsConfig())
        self.on_endpoints: OnEndpoints | None = None

    async def start(self, on_endpoints: OnEndpoints, on_server_removed: OnServerRemoved) -> DriverInfo:
        self.on_endpoints = on_endpoints
        on_endpoints(self.endpoints)
        return DriverInfo(self.client_id, "static", self.num_partitions)

    def move(self, endpoints: dict[str, list[PartitionInfo]]) -> None:
        """A new assignment, as the cluster manager would publish it."""
        assert self.on_endpoints is not None
        self.endpoints = endpoints
        self.on_endpoints(endpoints)

    async def open_channel(self, endpoint: str) -> Channel:
        return await open_framed_channel(endpoint, self._ssl)

    async def close(self) -> None:
        return None
