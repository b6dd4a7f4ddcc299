"""Where a client gets its identity, its servers and its connections (the original's WaltzClientDriver).

``ZooKeeperDriver`` is the real thing: a client id from ``<root>/ids/client``, the cluster's
name and partition count, endpoints and generations from the cluster manager, TLS
connections speaking the 'L' codec. The mock driver (:mod:`mock_driver`) replaces all of it
with in-memory partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.client.channel import Channel, FramedChannel
from waltz_engine.client.network_client import Endpoint
from waltz_engine.common.address import parse_host_port
from waltz_engine.net.channel import connect
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.wire.client_messages import CLIENT_CODECS
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT
from waltz_engine.zk.cluster import next_client_id, read_cluster_params
from waltz_engine.zk.cluster_manager import ClusterWatcher
from waltz_engine.zk.connection import ZooKeeperError, ZooKeeperSettings, describe
from waltz_engine.zk.payloads import PartitionInfo

# kazoo logs every failed connection attempt ("Connection dropped: ..."); without a handler of
# ours Python's last-resort handler prints each on stderr. An application that configures
# logging still sees them, under this name.
_KAZOO_LOGGER = logging.getLogger("waltz_engine.client.kazoo")
_KAZOO_LOGGER.addHandler(logging.NullHandler())

OnEndpoints = Callable[[dict[Endpoint, list[PartitionInfo]]], None]
OnServerRemoved = Callable[[Endpoint], None]


async def open_framed_channel(endpoint: Endpoint, ssl_context: ssl.SSLContext) -> FramedChannel:
    """A TLS connection to a Waltz server, Hello "Waltz Client", codecs v0-v4 (highest common wins)."""
    host, port = parse_host_port(endpoint, "Server")
    conn = await connect(host, port, ssl_context, CLIENT_CODECS, CLIENT_HELLO_TEXT)
    return FramedChannel(conn)


class DriverInfo(NamedTuple):
    client_id: int
    cluster_name: str
    num_partitions: int


class WaltzClientDriver(ABC):
    @abstractmethod
    async def start(self, on_endpoints: OnEndpoints, on_server_removed: OnServerRemoved) -> DriverInfo:
        """Join the cluster; endpoint changes arrive on the running loop from now on."""

    @abstractmethod
    async def open_channel(self, endpoint: Endpoint) -> Channel:
        """A new connection to ``endpoint``; raises WaltzError or OSError when it cannot be made."""

    @abstractmethod
    async def close(self) -> None: ...


class ZooKeeperDriver(WaltzClientDriver):
    def __init__(
        self,
        settings: ZooKeeperSettings,
        tls: TlsConfig,
        endpoint_overrides: Mapping[Endpoint, Endpoint] | None = None,
    ) -> None:
        self._settings = settings
        self._ssl: ssl.SSLContext = client_context(tls)
        self._endpoint_overrides = dict(endpoint_overrides or {})
        self._zk: KazooClient | None = None
        self._watcher: ClusterWatcher | None = None

    async def start(self, on_endpoints: OnEndpoints, on_server_removed: OnServerRemoved) -> DriverInfo:
        settings = self._settings
        zk = KazooClient(
            hosts=settings.connect_string, timeout=settings.session_timeout_ms / 1000, logger=_KAZOO_LOGGER
        )
        self._zk = zk
        try:
            await asyncio.to_thread(zk.start, settings.connect_timeout_ms / 1000)
        except KazooTimeoutError:
            raise ZooKeeperError(
                f"cannot connect to ZooKeeper at {settings.connect_string} "
                f"(no answer within {settings.connect_timeout_ms} ms)"
            ) from None
        try:
            client_id = await asyncio.to_thread(next_client_id, zk, settings.cluster_root)
            params = await asyncio.to_thread(read_cluster_params, zk, settings.cluster_root)
            self._watcher = ClusterWatcher(
                zk, settings.cluster_root, on_endpoints=on_endpoints, on_server_removed=on_server_removed
            )
            await self._watcher.start()
        except KazooException as e:
            raise ZooKeeperError(f"ZooKeeper at {settings.connect_string}: {describe(e)}") from None
        return DriverInfo(client_id, params.name, params.num_partitions)

    async def open_channel(self, endpoint: Endpoint) -> Channel:
        return await open_framed_channel(self._endpoint_overrides.get(endpoint, endpoint), self._ssl)

    async def close(self) -> None:
        if self._watcher is not None:
            await self._watcher.close()
        zk = self._zk
        if zk is not None:
            with contextlib.suppress(KazooException, KazooTimeoutError):
                await asyncio.to_thread(zk.stop)
                await asyncio.to_thread(zk.close)
