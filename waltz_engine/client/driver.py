"""Where a client gets its identity, its servers and its connections (the original's WaltzClientDriver).

``ZooKeeperDriver`` is the real thing: a client id from ``<root>/ids/client``, the cluster's
name and partition count, endpoints and generations from the cluster manager, TLS
connections speaking the 'L' codec. The mock driver (:mod:`mock_driver`) replaces all of it
with in-memory partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.client.channel import Channel, FramedChannel
from waltz_engine.client.errors import ClientTlsRefusedError
from waltz_engine.client.network_client import Endpoint
from waltz_engine.common.address import parse_host_port
from waltz_engine.net.channel import (
    CONNECT_TIMEOUT_MS,
    STREAM_READ_LIMIT_BYTES,
    ConnectionClosedError,
    FramedConnection,
    handshake,
)
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network, tls_context
from waltz_engine.wire.client_messages import CLIENT_CODECS, EXTENDED_CLIENT_CODECS
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT
from waltz_engine.zk.cluster import next_client_id, read_cluster_params
from waltz_engine.zk.cluster_manager import ClusterWatcher
from waltz_engine.zk.connection import (
    ZooKeeperConnector,
    ZooKeeperError,
    ZooKeeperSettings,
    describe,
    new_client,
)
from waltz_engine.zk.payloads import PartitionInfo

OnEndpoints = Callable[[dict[Endpoint, list[PartitionInfo]]], None]
OnServerRemoved = Callable[[Endpoint], None]


# TLS alerts that mean "your certificate": none sent, or not accepted (OpenSSL's reason names).
CERTIFICATE_WANTED_REASONS = frozenset(
    {"TLSV13_ALERT_CERTIFICATE_REQUIRED", "PEER_DID_NOT_RETURN_A_CERTIFICATE"}
)
CERTIFICATE_REFUSED_REASONS = frozenset(
    {
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
        "TLSV1_ALERT_DECRYPT_ERROR",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
    }
)


def describe_certificate_refusal(
    endpoint: Endpoint, error: BaseException, has_certificate: bool, after_tls: bool
) -> str | None:
    """Why ``endpoint`` refused the connection, if it was this client's certificate; else None.

    A TLS alert says so outright. A server that does not send one (asyncio's TLS drops the
    socket) shows it by the moment it hangs up: with TLS 1.2 during the TLS handshake, with
    TLS 1.3 (where the server checks the client's certificate after the client's handshake is
    done) right after it, before the server's Hello, which a Waltz server always sends.
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        reason = getattr(cause, "reason", None) if isinstance(cause, ssl.SSLError) else None
        if reason in CERTIFICATE_WANTED_REASONS:
            return f"the server {endpoint} asked for this client's certificate ({reason}){_NO_KEY_STORE}"
        if reason in CERTIFICATE_REFUSED_REASONS:
            return f"the server {endpoint} refused this client's certificate ({reason})"
        if isinstance(cause, ssl.SSLError) and reason is not None:
            return None  # another TLS failure: its own message says it
        cause = cause.__cause__ or cause.__context__
    # Not ConnectionRefusedError: nothing listens there, no TLS was spoken.
    hung_up = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError)
    dropped = isinstance(error, (*hung_up, asyncio.IncompleteReadError)) or (
        after_tls and isinstance(error, ConnectionClosedError)
    )
    if not dropped:
        return None
    when = "right after the TLS handshake, before its Hello" if after_tls else "during the TLS handshake"
    if has_certificate:
        return f"the server {endpoint} refused this client's certificate (it hung up {when})"
    return f"the server {endpoint} asked for this client's certificate (it hung up {when}){_NO_KEY_STORE}"


_NO_KEY_STORE = "; this client has none: set client.ssl.keyStore.location"


async def open_framed_channel(
    endpoint: Endpoint,
    ssl_context: ssl.SSLContext | None,
    has_certificate: bool = False,
    network: Network = ASYNCIO_NETWORK,
) -> FramedChannel:
    """A TLS connection to a Waltz server, Hello "Waltz Client", codecs v0-v4 (and
    our v5 with a certificate; highest common wins).

    A server that refuses the client's certificate (or wants one) raises ClientTlsRefusedError.
    """
    host, port = parse_host_port(endpoint, "Server")
    after_tls = False

    async def go() -> FramedConnection:
        nonlocal after_tls
        reader, writer = await network.open_connection(host, port, ssl_context, STREAM_READ_LIMIT_BYTES)
        after_tls = True
        try:
            # Our version 5 (the server's ACL refusals) only with a certificate: without one no
            # server can name, and so refuse, this client, and the Hello stays the original's.
            codecs = EXTENDED_CLIENT_CODECS if has_certificate else CLIENT_CODECS
            return await handshake(reader, writer, codecs, CLIENT_HELLO_TEXT, CONNECT_TIMEOUT_MS)
        except BaseException:
            writer.close()
            raise

    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
            conn = await go()
    except TimeoutError:
        raise ConnectionClosedError(f"no answer from {host}:{port} within {CONNECT_TIMEOUT_MS} ms") from None
    except (OSError, ssl.SSLError, ConnectionClosedError, asyncio.IncompleteReadError) as e:
        refusal = describe_certificate_refusal(endpoint, e, has_certificate, after_tls)
        if refusal is not None:
            raise ClientTlsRefusedError(refusal) from e
        if isinstance(e, ConnectionClosedError):
            raise
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {e or type(e).__name__}") from e
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
        network: Network = ASYNCIO_NETWORK,
        zk_connector: ZooKeeperConnector = new_client,
    ) -> None:
        self._settings = settings
        self._network = network
        self._zk_connector = zk_connector
        self._ssl = tls_context(network, lambda: client_context(tls))
        # A certificate, or an identity the (simulated) network carries for this host.
        self._has_certificate = (
            tls.key_store_location is not None or getattr(network, "principal", None) is not None
        )
        self._endpoint_overrides = dict(endpoint_overrides or {})
        self._zk: KazooClient | None = None
        self._watcher: ClusterWatcher | None = None

    async def start(self, on_endpoints: OnEndpoints, on_server_removed: OnServerRemoved) -> DriverInfo:
        settings = self._settings
        self._zk = zk = self._zk_connector(settings)
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
        return await open_framed_channel(
            self._endpoint_overrides.get(endpoint, endpoint), self._ssl, self._has_certificate, self._network
        )

    async def close(self) -> None:
        if self._watcher is not None:
            await self._watcher.close()
        zk = self._zk
        if zk is not None:
            with contextlib.suppress(KazooException, KazooTimeoutError):
                await asyncio.to_thread(zk.stop)
                await asyncio.to_thread(zk.close)
