"""Framed TLS connections with the Hello handshake: what every Waltz port speaks (reference §0.1).

Both sides send a Hello (their codec versions and a text) on connect and switch to the
highest version they share; a second Hello, a wrong magic or a bad length closes the
connection. Reading is pulled by the owner of the connection: a handler that stops
calling :meth:`FramedConnection.receive` stops reading from the socket, which is how back
pressure reaches the peer (TCP flow control), with no unbounded buffer in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from waltz_engine.common.errors import ProtocolError, WaltzError
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.frame import MAX_FRAME_SIZE_BYTES, read_frame
from waltz_engine.wire.hello import HELLO_CODEC, HELLO_MAGIC, HELLO_VERSION, Hello, negotiate_version

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 10_000
# Above this many unsent bytes a sender waits (the original's 32 KiB write high-water mark).
WRITE_BUFFER_HIGH_BYTES = 32 * 1024
WRITE_BUFFER_LOW_BYTES = 16 * 1024
STREAM_READ_LIMIT_BYTES = 1024 * 1024


class ConnectionClosedError(WaltzError):
    """The peer closed the connection, or it was closed under a pending call."""


class FramedConnection:
    """One connection after a successful handshake: messages of one negotiated codec."""

    __slots__ = ("reader", "writer", "codec", "peer_hello", "peer", "_closed")

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        codec: MessageCodec[Any],
        peer_hello: Hello,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.codec = codec
        self.peer_hello = peer_hello
        peername = writer.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._closed = False
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)

    @property
    def version(self) -> int:
        return self.codec.version

    @property
    def closed(self) -> bool:
        return self._closed or self.writer.is_closing()

    async def receive(self) -> Any | None:
        """The next message (keep-alives are skipped); None when the peer closed cleanly.

        Bad bytes raise a ProtocolError subclass: the caller logs it and closes.
        """
        while True:
            frame = await read_frame(
                self.reader, self.codec.magic, self.codec.version, max_frame_size_bytes=MAX_FRAME_SIZE_BYTES
            )
            if frame is None:
                return None
            message = self.codec.decode_frame(frame)
            if message is not None:
                return message

    def send_frame(self, frame: bytes) -> None:
        """Queue an encoded frame; pair with :meth:`drain` to respect the write buffer limit."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        self.writer.write(frame)

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Queue several frames at once: over TLS, one flush to the socket instead of one each."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        self.writer.writelines(frames)

    async def send(self, message: Any) -> None:
        self.send_frame(self.codec.encode_frame(message))
        await self.drain()

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, ssl.SSLError) as e:
            raise ConnectionClosedError(f"connection to {self.peer} lost: {e}") from e

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        # The peer is gone either way; waiting only lets TLS say goodbye.
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), HANDSHAKE_TIMEOUT_MS / 1000)


async def handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
) -> FramedConnection:
    """Exchange Hellos and pick the codec; raises ProtocolError (or TimeoutError) on failure."""
    assert codecs, "a connection needs at least one codec version"
    writer.write(HELLO_CODEC.encode_frame(Hello(tuple(sorted(codecs)), hello_text)))
    frame = await asyncio.wait_for(read_frame(reader, HELLO_MAGIC, HELLO_VERSION), timeout_ms / 1000)
    if frame is None:
        raise ConnectionClosedError("peer closed the connection during the handshake")
    hello = HELLO_CODEC.decode_frame(frame)
    if hello is None:
        raise ProtocolError("a keep-alive frame arrived before the Hello")
    version = negotiate_version(codecs, hello.versions)
    return FramedConnection(reader, writer, codecs[version], hello)


async def connect(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    timeout_ms: int = CONNECT_TIMEOUT_MS,
) -> FramedConnection:
    """Open a TLS connection and complete the handshake, all within ``timeout_ms``."""

    async def go() -> FramedConnection:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl_context, limit=STREAM_READ_LIMIT_BYTES
        )
        try:
            return await handshake(reader, writer, codecs, hello_text, timeout_ms)
        except BaseException:
            writer.close()
            raise

    try:
        return await asyncio.wait_for(go(), timeout_ms / 1000)
    except TimeoutError:
        raise ConnectionClosedError(f"no answer from {host}:{port} within {timeout_ms} ms") from None
    except (OSError, ssl.SSLError) as e:
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {e}") from e


ConnectionHandler = Callable[[FramedConnection], Awaitable[None]]


class Listener:
    """A port :func:`serve` listens on, and the tasks of its open connections (one each, from
    accept to the handler's return), so that stopping a node can end them."""

    def __init__(self, server: asyncio.Server, connections: set[asyncio.Task[None]]) -> None:
        self.server = server
        self.connections = connections

    @property
    def sockets(self) -> tuple[Any, ...]:
        return tuple(self.server.sockets)

    def close(self) -> None:
        """Stop accepting; open connections go on until :meth:`end_connections`."""
        self.server.close()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()

    async def end_connections(self, timeout_s: float) -> None:
        """Cancel every open connection's task and wait for them, at most ``timeout_s``."""
        tasks = list(self.connections)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)


async def serve(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    handler: ConnectionHandler,
    name: str,
) -> Listener:
    """Accept TLS connections; each gets a handshake, then ``handler`` owns it until it returns.

    A failed handshake or a protocol error is logged with its reason and only that
    connection is closed; the server keeps serving the others.
    """

    loop = asyncio.get_running_loop()

    async def accept(transport: asyncio.BaseTransport, peer: str) -> None:
        try:
            reader, writer = await _start_server_tls(loop, transport, ssl_context)
        except (TimeoutError, ConnectionError, ssl.SSLError) as e:
            log.warning("%s: closed connection from %s: TLS handshake failed: %s", name, peer, e or "timeout")
            transport.close()
            return
        try:
            conn = await handshake(reader, writer, codecs, hello_text)
        except (ProtocolError, ConnectionClosedError, TimeoutError, ConnectionError, ssl.SSLError) as e:
            log.warning("%s: closed connection from %s during handshake: %s", name, peer, e or "timeout")
            writer.close()
            return
        try:
            await handler(conn)
        except ProtocolError as e:
            log.warning("%s: closed connection from %s: %s", name, peer, e)
        except (ConnectionClosedError, ConnectionError, ssl.SSLError) as e:
            log.info("%s: connection from %s ended: %s", name, peer, e)
        finally:
            await conn.close()

    tasks: set[asyncio.Task[None]] = set()

    class _Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # Nothing may be read before TLS takes over the socket, or the peer's first TLS
            # bytes would be lost; start_tls resumes reading.
            assert isinstance(transport, asyncio.Transport)
            transport.pause_reading()
            peername = transport.get_extra_info("peername")
            peer = f"{peername[0]}:{peername[1]}" if peername else "?"
            task = loop.create_task(accept(transport, peer), name=f"{name}-accept-{peer}")
            tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(tasks.discard)

    return Listener(await loop.create_server(_Accept, host, port), tasks)


async def _start_server_tls(
    loop: asyncio.AbstractEventLoop, transport: asyncio.BaseTransport, ssl_context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The server side of a TLS handshake on an accepted socket, as streams."""
    reader = asyncio.StreamReader(limit=STREAM_READ_LIMIT_BYTES, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    tls_transport = await loop.start_tls(
        transport,  # type: ignore[arg-type]
        protocol,
        ssl_context,
        server_side=True,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_MS / 1000,
    )
    assert tls_transport is not None
    protocol.connection_made(tls_transport)
    return reader, asyncio.StreamWriter(tls_transport, protocol, reader, loop)
