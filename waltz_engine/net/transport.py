"""The network seam: how a node opens connections and listens, handed to it at construction.

Production passes :data:`ASYNCIO_NETWORK` (the operating system's sockets on the asyncio loop,
each a :class:`waltz_engine.net.socket_transport.SocketTransport` that drives the socket's
own TLS; an accepted one is handed over before TLS starts, see ``channel.serve``); the simulator
passes each node its view of an in-memory network
(``waltz_engine.sim.network.SimNetwork.node``), where TLS is off (``ssl_context=None``).
Everything above this seam (the Hello handshake, framing, connection limits) is the same code
in both.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from waltz_engine.net import socket_transport

ProtocolFactory = Callable[[], asyncio.Protocol]


class ServerHandle(Protocol):
    """A listening port (asyncio's ``Server`` has this shape)."""

    @property
    def sockets(self) -> Sequence[Any]:
        """What it listens on; ``sockets[0].getsockname()[1]`` is the port."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class Network(Protocol):
    # False: the network carries plain bytes (the simulator's); nodes build no TLS context.
    tls: bool

    async def open_connection(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host:port`` as streams, over TLS when ``ssl_context`` is given; raises
        OSError (or TimeoutError) when it cannot be made."""

    async def create_server(self, protocol_factory: ProtocolFactory, host: str, port: int) -> ServerHandle:
        """Listen on ``host:port`` (port 0: any free one); each accepted connection gets a new
        protocol from ``protocol_factory`` (TLS, if any, is the protocol's business)."""


class AsyncioNetwork:
    """The operating system's network, through the running asyncio loop."""

    tls = True

    async def open_connection(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = await socket_transport.open_connection(host, port, ssl_context, protocol)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def create_server(self, protocol_factory: ProtocolFactory, host: str, port: int) -> ServerHandle:
        return await socket_transport.listen(protocol_factory, host, port)


ASYNCIO_NETWORK: Network = AsyncioNetwork()


def tls_context(network: Network, build: Callable[[], ssl.SSLContext]) -> ssl.SSLContext | None:
    """``build()`` (a node's TLS context from its config) where ``network`` speaks TLS, else None."""
    return build() if network.tls else None
