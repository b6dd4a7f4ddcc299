"""Framed TLS connections with the Hello handshake: what every Waltz port speaks (reference §0.1).

Both sides send a Hello (their codec versions and a text) on connect and switch to the
highest version they share; a second Hello, a wrong magic or a bad length closes the
connection. Reading is pulled by the owner of the connection: a handler that stops
calling :meth:`FramedConnection.receive` stops reading from the socket, which is how back
pressure reaches the peer (TCP flow control), with no unbounded buffer in between.

What a listening port admits is bounded (:class:`ConnectionLimits`, config keys on both node
kinds): open connections per node and per peer address (beyond them a new connection is
closed at once), the time from accept to the Hello, and the bytes buffered per connection.
A connection has no TLS state until its first byte, and TLS reads into one buffer per
thread (asyncio's own keeps 256 KiB per connection): an idle flood costs a few KiB each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

from waltz_engine.common.errors import ProtocolError, WaltzError
from waltz_engine.common.loop_turns import call_at_turn_end
from waltz_engine.net.connection_limits import (
    HANDSHAKE_TIMEOUT_MS,
    ConnectionGate,
)
from waltz_engine.net.listener import Listener
from waltz_engine.net.socket_transport import SocketTransport
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network, StreamReader
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.errors import TruncatedFrameError
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES, MAX_FRAME_SIZE_BYTES, FrameDecoder, read_frame
from waltz_engine.wire.hello import HELLO_CODEC, HELLO_MAGIC, HELLO_VERSION, Hello, negotiate_version

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS = 10_000
# Above this many unsent bytes a sender waits (the original's 32 KiB write high-water mark).
WRITE_BUFFER_HIGH_BYTES = 32 * 1024
WRITE_BUFFER_LOW_BYTES = 16 * 1024
STREAM_READ_LIMIT_BYTES = 1024 * 1024
# send_frames joins pieces up to this many bytes in all: TLS's largest record (RFC 8446 §5.1).
JOIN_LIMIT_BYTES = 16 * 1024
# In a connection's backlog (FramedConnection.handle): wait for the write buffer to drain.
_DRAIN = object()


class HandBack(NamedTuple):
    """What another reader of a connection gives back to :meth:`FramedConnection.handle`: the
    end it met (``ended``, with its error: None for a clean end of stream), or the messages it
    decoded and did not serve and the bytes it read past them."""

    ended: bool
    error: BaseException | None
    messages: Sequence[Any]
    unread: bytes


class ConnectionClosedError(WaltzError):
    """The peer closed the connection, or it was closed under a pending call."""


class FramedConnection:
    """One connection after a successful handshake: messages of one negotiated codec."""

    __slots__ = (
        "reader",
        "writer",
        "codec",
        "peer_hello",
        "peer",
        "max_frame_size_bytes",
        "writes",
        "_closed",
        "_unsent",
        "_coalesce",
        "_transport",
    )

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        codec: MessageCodec[Any],
        peer_hello: Hello,
        max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.codec = codec
        self.peer_hello = peer_hello
        peername = writer.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self.max_frame_size_bytes = max_frame_size_bytes
        self.writes = 0  # handed to the transport, each one flush to the socket
        self._closed = False
        self._unsent = bytearray()
        self._coalesce: Callable[[], bool] | None = None
        # The writer's transport, kept: its property and the writer's pass-through methods cost a
        # call each, several times per request on a node's hot path.
        self._transport = writer.transport
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)

    @property
    def version(self) -> int:
        return self.codec.version

    def peer_certificate_der(self) -> bytes | None:
        """The certificate the peer presented in the TLS handshake, DER-encoded (None: it sent
        none, or the connection is not TLS, as the simulator's): an identity for access rules."""
        get = getattr(self.writer.transport, "peer_certificate_der", None)
        return get() if get is not None else None

    @property
    def closed(self) -> bool:
        return self._closed or self._transport.is_closing()

    def write_buffer_bytes(self) -> int:
        """What the transport holds unsent (the writer's ``transport`` property costs a call more)."""
        return self._transport.get_write_buffer_size()

    async def receive(self) -> Any | None:
        """The next message (keep-alives are skipped); None when the peer closed cleanly.

        Bad bytes raise a ProtocolError subclass: the caller logs it and closes.
        """
        while True:
            frame = await read_frame(
                self.reader,
                self.codec.magic,
                self.codec.version,
                max_frame_size_bytes=self.max_frame_size_bytes,
            )
            if frame is None:
                return None
            message = self.codec.decode_frame(frame)
            if message is not None:
                return message

    def dispatch(
        self,
        on_message: Callable[[Any], None],
        on_end: Callable[[BaseException | None], None],
        on_bytes: Callable[[bytes], bool] | None = None,
    ) -> tuple[Callable[[bytes], None], Callable[[], int]]:
        """From now on cut frames as bytes arrive and hand each message to ``on_message`` in the
        transport's read callback (no task, no loop turn); the end goes to ``on_end`` once: None
        for a clean end of stream, else the error (a ProtocolError for bad bytes, after which the
        connection is closed). :meth:`receive` is not used after this.

        ``on_bytes`` sees what arrives before the frame decoder does, when no frame is partly
        buffered: True means it recognised whole frames and handled them (the storage client's
        fixed-size SUCCESS answers, without a decoder pass and a codec lookup each); False
        leaves the bytes to the decoder.

        Returns the bytes' way in (for bytes read elsewhere and handed back, as by the storage
        node's connection thread) and how many bytes of a frame the decoder holds."""
        reader = self.reader
        assert isinstance(reader, StreamReader), "connections are built with net.transport.StreamReader"
        codec = self.codec
        decoder = FrameDecoder(codec.magic, codec.version, max_frame_size_bytes=self.max_frame_size_bytes)
        decode = self.codec.decode_frame
        ended = False

        def end(error: BaseException | None) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            if error is None and decoder.buffered_bytes:
                error = TruncatedFrameError(f"stream ended {decoder.buffered_bytes} bytes into a frame")
            on_end(error)

        def on_data(data: bytes) -> None:
            if ended:
                return
            if on_bytes is not None and not decoder.buffered_bytes and on_bytes(data):
                return
            try:
                frames = decoder.feed(data)
                for frame in frames:
                    message = decode(frame)
                    if message is not None:
                        on_message(message)
            except ProtocolError as e:
                self.writer.transport.abort()
                end(e)

        reader.sink(on_data, end)
        return on_data, lambda: decoder.buffered_bytes

    async def handle(
        self,
        now: Callable[[Any], bool],
        later: Callable[[Any], Awaitable[None]],
        recognise: Callable[[bytes], Any | None] | None = None,
        take_over: Callable[[], Awaitable[HandBack | None]] | None = None,
    ) -> None:
        """Serve the connection until it ends: each message goes to ``now`` in the read callback
        (True: handled, with no waiting); one it declines, and every one after it, goes to
        ``later`` on this task, in order, with reading paused until they are through. Reading
        pauses too while the write buffer is above its high-water mark (the peer does not read
        its answers). Returns at a clean end; raises the end's error, or ``later``'s.

        ``recognise(data)``: the message that bytes read whole are, decoded without the frame
        decoder (None: the decoder takes them), for the commonest request of a connection.

        ``take_over()``: asked, with reading paused, each time the backlog is through and no
        frame is partly read, whether something else reads the connection from here (the
        storage node's connection thread). None: declined, reading resumes here. Else it
        returns once that reader is done: the connection's end, or the messages it decoded
        and did not serve and the bytes it read past them, which are served here, in order."""
        transport = self.writer.transport
        assert isinstance(transport, asyncio.Transport)
        backlog: deque[Any] = deque()
        wake = asyncio.Event()
        ended: list[BaseException | None] = []

        def over_high_water() -> bool:
            return transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES

        def on_message(message: Any) -> None:
            if not backlog and now(message):
                if not over_high_water():
                    return
                backlog.append(_DRAIN)
            else:
                backlog.append(message)
            transport.pause_reading()
            wake.set()

        def on_end(error: BaseException | None) -> None:
            ended.append(error)
            wake.set()

        on_bytes: Callable[[bytes], bool] | None = None
        if recognise is not None:
            recognised = recognise

            def on_bytes(data: bytes) -> bool:
                message = recognised(data)
                if message is None:
                    return False
                on_message(message)
                return True

        feed, buffered_bytes = self.dispatch(on_message, on_end, on_bytes)
        while True:
            await wake.wait()
            wake.clear()
            while backlog:
                message = backlog.popleft()
                if message is not _DRAIN:
                    await later(message)
                if over_high_water():
                    await self.drain()
            if not ended and take_over is not None and not buffered_bytes() and not self.closed:
                handed = await take_over()
                if handed is not None:
                    if handed.ended:
                        on_end(handed.error)
                    for message in handed.messages:
                        on_message(message)
                    if handed.unread:
                        feed(handed.unread)
                    if backlog or ended:
                        continue  # (``wake`` is set)
            if ended:
                if ended[0] is not None:
                    raise ended[0]
                return
            transport.resume_reading()

    def send_frame(self, frame: bytes) -> None:
        """Queue an encoded frame; pair with :meth:`drain` to respect the write buffer limit."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        if self._unsent:
            self._flush()  # after the frames sent before it
        self._transport.write(frame)  # the stream writer's write only passes it on

    def send_frames(self, frames: Sequence[bytes | bytearray | memoryview]) -> None:
        """Queue several frames (or one frame's pieces, in order) at once: over TLS, one flush
        to the socket instead of one each.

        Pieces that fit one TLS record together are joined first: TLS encrypts each piece it is
        given as a record of its own, so an APPEND's three pieces or a batch of small replies
        would cost a record (and an SSL_read on the other side) each. Larger ones are not copied.
        With :meth:`coalesce_writes`, what is sent within one loop turn leaves together.
        """
        if self._closed or self._transport.is_closing():  # (``closed``, inline: 3 per lone commit)
            raise ConnectionClosedError(f"connection to {self.peer} is closed")
        unsent = self._unsent
        if not unsent and (self._coalesce is None or not self._coalesce()):
            self._write(frames)
            return
        size = sum(map(len, frames))
        if len(unsent) + size > JOIN_LIMIT_BYTES:
            unsent = self._flush()  # at most one TLS record waits
            if size > JOIN_LIMIT_BYTES:
                self._write(frames)
                return
        if not unsent:
            # At the end of the turn: run at once by a read callback that ends it (run_turn_end).
            call_at_turn_end(asyncio.get_running_loop(), self._flush)
        for frame in frames:
            unsent += frame

    def send_frames_from_thread(self, frames: Sequence[bytes], loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`send_frames` from a thread other than ``loop``'s: straight to the socket when
        the transport can take them from a thread (``write_from_thread``: no wake-up of the
        loop), else through the loop (the simulator's transports). In order with every other
        write of the connection; a connection that is gone drops them (as :meth:`send_frames`'
        callers do)."""
        write = getattr(self._transport, "write_from_thread", None)
        if write is not None and not self._closed and self._coalesce is None:
            if write(frames[0] if len(frames) == 1 else b"".join(frames)):
                self.writes += 1
            return
        loop.call_soon_threadsafe(self._send_frames_if_open, frames)

    def _send_frames_if_open(self, frames: Sequence[bytes]) -> None:
        if not self.closed:
            self.send_frames(frames)

    @property
    def coalescing(self) -> bool:
        """Frames sent in one loop turn leave as one write (:meth:`coalesce_writes`)."""
        return self._coalesce is not None

    def coalesce_writes(self, busy: Callable[[], bool]) -> None:
        """While ``busy()`` holds as a frame is sent, frames sent in one loop turn (by any tasks) leave
        as one write at its end: one TLS record and one send, the most that waits."""
        self._coalesce = busy

    def _flush(self) -> bytearray:
        unsent, self._unsent = self._unsent, bytearray()  # the transport may keep the old one
        if unsent and not self.closed:
            self._write((unsent,))
        return self._unsent

    def _write(self, frames: Sequence[bytes | bytearray | memoryview]) -> None:
        self.writes += 1
        # To the transport itself: the stream writer's write and writelines only pass it on.
        transport = self._transport
        if len(frames) > 1 and sum(map(len, frames)) <= JOIN_LIMIT_BYTES:
            transport.write(b"".join(frames))
        else:
            transport.writelines(frames)

    async def send(self, message: Any) -> None:
        self.send_frame(self.codec.encode_frame(message))
        await self.drain()

    @property
    def drain_may_wait(self) -> bool:
        """False when :meth:`drain` would return at once: the send buffer is at or below its
        low-water mark, so writing is not paused (it resumes only there)."""
        return self._transport.get_write_buffer_size() > WRITE_BUFFER_LOW_BYTES

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, ssl.SSLError) as e:
            raise ConnectionClosedError(f"connection to {self.peer} lost: {e}") from e

    async def close(self) -> None:
        if self._closed:
            return
        self._flush()
        self._closed = True
        self.writer.close()
        if not _in_a_task() or _finalizing_a_coroutine():
            # A coroutine being finalized (closed by the garbage collector, its task gone) runs
            # its cleanup outside its task: it can wait for nothing. Outside any task,
            # asyncio.timeout raised "Timeout should be used inside a task" (seen at simulated
            # worlds' teardown); during another task's step (a collection starts at any
            # allocation) it bound that task, the wait "ignored GeneratorExit", and the timeout
            # cancelled the innocent task later.
            return
        # The peer is gone either way; waiting only lets TLS say goodbye.
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            # asyncio.timeout, not wait_for (Python 3.11's can lose a cancellation of ours).
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_MS / 1000):
                await self.writer.wait_closed()


async def handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
    max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES,
) -> FramedConnection:
    """Exchange Hellos and pick the codec; raises ProtocolError (or TimeoutError) on failure."""
    assert codecs, "a connection needs at least one codec version"
    writer.write(HELLO_CODEC.encode_frame(Hello(tuple(sorted(codecs)), hello_text)))
    async with asyncio.timeout(timeout_ms / 1000):
        frame = await read_frame(reader, HELLO_MAGIC, HELLO_VERSION)
    if frame is None:
        raise ConnectionClosedError("peer closed the connection during the handshake")
    hello = HELLO_CODEC.decode_frame(frame)
    if hello is None:
        raise ProtocolError("a keep-alive frame arrived before the Hello")
    version = negotiate_version(codecs, hello.versions)
    return FramedConnection(reader, writer, codecs[version], hello, max_frame_size_bytes)


async def connect(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    timeout_ms: int = CONNECT_TIMEOUT_MS,
    network: Network = ASYNCIO_NETWORK,
) -> FramedConnection:
    """Open a TLS connection (plain with no ``ssl_context``: the simulator's) and complete the
    handshake, all within ``timeout_ms``."""

    async def go() -> FramedConnection:
        reader, writer = await network.open_connection(host, port, ssl_context, STREAM_READ_LIMIT_BYTES)
        try:
            return await handshake(reader, writer, codecs, hello_text, timeout_ms)
        except BaseException:
            writer.close()
            raise

    try:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the connection when it
        # and a cancellation of the caller arrive in the same loop turn (the cancellation is lost).
        async with asyncio.timeout(timeout_ms / 1000):
            return await go()
    except TimeoutError:
        raise ConnectionClosedError(f"no answer from {host}:{port} within {timeout_ms} ms") from None
    except (OSError, ssl.SSLError) as e:
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {e}") from e


ConnectionHandler = Callable[[FramedConnection], Awaitable[None]]


def _in_a_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no loop runs: a coroutine finalized after its loop stopped
        return False


def _finalizing_a_coroutine() -> bool:
    """A ``GeneratorExit`` is handled (or is the context of what is): the caller runs in a
    coroutine being closed, by ``close()`` or the collector (a task never throws it)."""
    error = sys.exc_info()[1]
    return isinstance(error, GeneratorExit) or isinstance(getattr(error, "__context__", None), GeneratorExit)


def _reason(e: BaseException) -> str:
    """Why a handshake failed, never empty: the error's text, else what kind of end it was."""
    if isinstance(e, TimeoutError):
        return "timeout"
    text = str(e)
    if isinstance(e, ConnectionResetError) and not text:
        return "the peer closed the connection (EOF)"
    return text or type(e).__name__


async def serve(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    codecs: Mapping[int, MessageCodec[Any]],
    hello_text: str,
    handler: ConnectionHandler,
    name: str,
    gate: ConnectionGate | None = None,
    network: Network = ASYNCIO_NETWORK,
) -> Listener:
    """Accept TLS connections (plain with no ``ssl_context``: the simulator's); each gets a
    handshake, then ``handler`` owns it until it returns.

    A failed handshake or a protocol error is logged with its reason and only that
    connection is closed; the server keeps serving the others. ``gate`` (shared by a node's
    ports; a gate of default limits if None) bounds the open connections, the handshake's
    time and the bytes buffered per connection.
    """

    loop = asyncio.get_running_loop()
    node_gate = gate if gate is not None else ConnectionGate()
    limits = node_gate.limits
    timeout_s = limits.handshake_timeout_ms / 1000
    # A StreamReader stops reading from the socket above twice its limit.
    stream_limit = max(1, limits.max_buffered_bytes // 2)
    max_frame_size_bytes = min(MAX_FRAME_SIZE_BYTES, limits.max_buffered_bytes - FRAME_HEADER_SIZE_BYTES)

    async def accept(
        transport: asyncio.Transport, address: str, peer: str, first: asyncio.Future[bytes] | None
    ) -> None:
        deadline = loop.time() + timeout_s
        what = "closed"
        try:
            async with asyncio.timeout_at(deadline):
                if isinstance(transport, SocketTransport):
                    sent = await transport.first_bytes()
                else:
                    assert first is not None
                    sent = bool(await first)
        except TimeoutError:
            sent, what = False, "timed out"
        except BaseException:
            transport.abort()
            raise
        if not sent:
            # A scan, a health check or an idle flood: one line per peer per interval.
            transport.abort()
            node_gate.warn_limited(
                f"silent {name} {address}",
                f"{name}: closed connection from {peer}: TLS handshake failed: "
                f"the peer sent nothing and {what} within {limits.handshake_timeout_ms} ms",
            )
            return
        try:
            async with asyncio.timeout_at(deadline):
                if isinstance(transport, SocketTransport):
                    reader, writer = await _start_server_socket(loop, transport, ssl_context, stream_limit)
                else:
                    assert ssl_context is None, "TLS is driven by SocketTransport only"
                    assert first is not None
                    reader, writer = _start_server_plain(loop, transport, first.result(), stream_limit)
        except (TimeoutError, ConnectionError, ssl.SSLError) as e:
            node_gate.warn_limited(
                f"tls {name} {address}",
                f"{name}: closed connection from {peer}: TLS handshake failed: {_reason(e)}",
            )
            transport.abort()
            return
        except BaseException:
            transport.abort()
            raise
        try:
            async with asyncio.timeout_at(deadline):
                conn = await handshake(
                    reader, writer, codecs, hello_text, limits.handshake_timeout_ms, max_frame_size_bytes
                )
        except (ProtocolError, ConnectionClosedError, TimeoutError, ConnectionError, ssl.SSLError) as e:
            log.warning("%s: closed connection from %s during handshake: %s", name, peer, _reason(e))
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
        """Until the first bytes: no TLS state is made for a peer that sends nothing."""

        def __init__(self) -> None:
            # The simulator's transports deliver the first bytes here; a SocketTransport is
            # asked for readability instead (nothing is read before TLS takes the socket).
            self.first: asyncio.Future[bytes] | None = None
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            peername = transport.get_extra_info("peername")
            address = str(peername[0]) if peername else "?"
            if not node_gate.admit(address, name):
                transport.abort()
                return
            if not isinstance(transport, SocketTransport):
                self.first = loop.create_future()
            peer = f"{address}:{peername[1]}" if peername else "?"
            task = loop.create_task(
                accept(transport, address, peer, self.first), name=f"{name}-accept-{peer}"
            )
            tasks.add(task)  # the loop keeps only weak references to tasks

            def done(task: asyncio.Task[None]) -> None:
                tasks.discard(task)
                node_gate.release(address)

            task.add_done_callback(done)

        def data_received(self, data: bytes) -> None:
            # The streams take over the transport from here: nothing more is read until then.
            assert self.transport is not None
            self.transport.pause_reading()
            if self.first is not None and not self.first.done():
                self.first.set_result(data)

        def eof_received(self) -> bool:
            if self.first is not None and not self.first.done():
                self.first.set_result(b"")
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            if self.first is not None and not self.first.done():
                self.first.set_result(b"")

    return Listener(await network.create_server(_Accept, host, port), tasks, node_gate)


def _start_server_plain(
    loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, first: bytes, stream_limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted connection without TLS (the simulator's) as streams: ``first`` is what was
    read from it before (its reading paused since)."""
    reader = StreamReader(limit=stream_limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    protocol.data_received(first)
    transport.resume_reading()
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _start_server_socket(
    loop: asyncio.AbstractEventLoop,
    transport: SocketTransport,
    ssl_context: ssl.SSLContext | None,
    stream_limit: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted socket that has bytes to read: its TLS handshake (none without a context),
    then streams on it."""
    if ssl_context is not None:
        await transport.start_tls(ssl_context, server_side=True, server_hostname=None)
    reader = StreamReader(limit=stream_limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.start(protocol)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
