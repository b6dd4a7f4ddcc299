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
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, SupportsIndex

from waltz_engine.net import socket_server

ProtocolFactory = Callable[[], asyncio.Protocol]


class StreamReader(asyncio.StreamReader):
    """asyncio's stream reader, whose bytes can go to a callback as they arrive instead.

    Every network builds its connections' readers of this class: a task reading frames
    (``FramedConnection.receive``) costs a loop turn per wake-up, a callback set by
    ``FramedConnection.dispatch`` none (frames are cut and handled in the transport's read
    callback itself). The bytes buffered before the callback was set are handed to it first.
    """

    _sink: Callable[[bytes], None] | None = None
    _sink_end: Callable[[BaseException | None], None] | None = None

    def sink(self, on_data: Callable[[bytes], None], on_end: Callable[[BaseException | None], None]) -> None:
        """From now on hand every byte to ``on_data``, and the end (None: EOF) to ``on_end`` once."""
        buffered: bytearray = self._buffer  # type: ignore[attr-defined]
        self._sink, self._sink_end = on_data, on_end
        self._transport_sink(on_data)
        if buffered:
            data = bytes(buffered)
            buffered.clear()
            on_data(data)
        if self._sink_end is None:
            return
        error = self.exception()
        if error is not None or self.at_eof():
            self._end(error)

    def unsink(self) -> None:
        """Buffer the bytes again, for ``read`` (the client's reader task after its read callback
        handed it a batch it could not finish: its reads, and their back pressure, as before)."""
        self._sink = self._sink_end = None
        self._transport_sink(None)

    def _transport_sink(self, on_data: Callable[[bytes], None] | None) -> None:
        """A transport that can (``SocketTransport.set_data_sink``) hands its reads to ``on_data``
        itself: what ``data_received`` and :meth:`feed_data` would do, three calls fewer a read."""
        set_data_sink = getattr(self._transport, "set_data_sink", None)  # type: ignore[attr-defined]
        if set_data_sink is not None:
            set_data_sink(on_data)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not read yet."""
        return len(self._buffer)  # type: ignore[attr-defined]

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        sink = self._sink
        if sink is None:
            super().feed_data(data)
        else:
            sink(bytes(data) if not isinstance(data, bytes) else data)

    def feed_eof(self) -> None:
        super().feed_eof()
        self._end(None)

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self._end(exc)

    def _end(self, error: BaseException | None) -> None:
        end, self._sink_end = self._sink_end, None
        if end is not None:
            self._sink = None
            self._transport_sink(None)
            end(error)


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

    def is_local_host(self, host: str) -> bool:
        """Whether every address ``host`` names belongs to this node's machine (can be bound here)."""


class AsyncioNetwork:
    """The operating system's network, through the running asyncio loop."""

    tls = True

    async def open_connection(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        reader = StreamReader(limit=limit, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport = await socket_server.open_connection(host, port, ssl_context, protocol)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def create_server(self, protocol_factory: ProtocolFactory, host: str, port: int) -> ServerHandle:
        return await socket_server.listen(protocol_factory, host, port)

    def is_local_host(self, host: str) -> bool:
        return is_local_host(host)


ASYNCIO_NETWORK: Network = AsyncioNetwork()


def is_local_host(host: str) -> bool:
    """Whether every address ``host`` resolves to belongs to this machine (can be bound here)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    if not infos:
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], 0))
            except OSError:
                return False
    return True


def tls_context(network: Network, build: Callable[[], ssl.SSLContext]) -> ssl.SSLContext | None:
    """``build()`` (a node's TLS context from its config) where ``network`` speaks TLS, else None."""
    return build() if network.tls else None


class PeerIdentity(NamedTuple):
    """Who the peer of a connection is, as the connection layer knows it."""

    # The verified certificate the peer presented (DER), None without TLS or without one.
    certificate: bytes | None
    # A principal the transport itself carries (the simulator's network, which has no TLS).
    principal: str | None = None


# The extra a transport without TLS may carry a peer's principal in (the simulator's).
PRINCIPAL_EXTRA = "waltz_principal"


def peer_identity(writer: asyncio.StreamWriter) -> PeerIdentity:
    """The peer's certificate or principal: the one place the transport is asked who is there
    (a change of TLS transport changes only this)."""
    ssl_object = writer.get_extra_info("ssl_object")
    certificate = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return PeerIdentity(certificate or None, writer.get_extra_info(PRINCIPAL_EXTRA))
