"""TLS (or plain TCP) on a non-blocking socket, driven by the loop's reader and writer callbacks.

asyncio's own TLS layer (``sslproto``) runs every byte through memory BIOs, a protocol state
machine and several Python calls per record: about half of a small request's CPU in a Waltz
node. Here the socket's own :class:`ssl.SSLSocket` reads from and writes to the kernel itself:
``recv_into`` a buffer reused by all the loop's connections, ``send`` straight from the caller's
bytes. What that asks of the driver (each an OpenSSL rule):

- a read may need the socket writable first (TLS 1.3 key updates and post-handshake messages):
  ``SSLWantWriteError`` on read waits for writability, then reads again;
- after a read, OpenSSL may hold decrypted bytes the selector knows nothing of (``pending()``):
  reading goes on while it does or the kernel holds more (``FIONREAD``; OpenSSL reads no further
  than the record it returns), until ``SSLWantReadError`` otherwise, and resuming a paused
  reader looks at them;
- a write that raised ``SSLWantWriteError`` (or ``SSLWantReadError``) must be retried with the
  same bytes before any other: the driver keeps that object (``_stuck``) and sends it first;
- close-notify (``unwrap``) is sent without waiting for the peer's, and a peer that closes
  without one (Netty does) is an end of stream like any other;
- the handshake is driven by the same callbacks (``do_handshake_on_connect=False``), under the
  caller's timeout.

An accepted socket starts with no TLS state at all (:meth:`SocketTransport.first_bytes`
waits for it to become readable without reading), so an idle connection costs a socket and
this object. No threads: one loop drives every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import ssl
import sys
import termios
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from waltz_engine.common.loop_turns import run_turn_end

log = logging.getLogger(__name__)

# One read takes at most this much; TLS hands out one record (16 KiB) per read anyway.
READ_BUFFER_BYTES = 256 * 1024
# Bytes read in one readable callback before the loop's other callbacks get their turn.
MAX_READ_PER_CALLBACK_BYTES = 1024 * 1024
# Reads of what a peer sent before a failed handshake, at most, before its socket is closed.
MAX_DRAIN_READS = 4
# Buffered writes are joined into sends of at most this many bytes.
MAX_SEND_BYTES = 256 * 1024
DEFAULT_WRITE_HIGH_BYTES = 64 * 1024
# Connections accepted per readable callback of a listening socket.
MAX_ACCEPTS_PER_CALLBACK = 100
LISTEN_BACKLOG = 100
# Out of file descriptors: stop accepting this long (asyncio's choice).
ACCEPT_RETRY_DELAY_S = 1.0

# What :meth:`SocketTransport.read_from_thread` returns when it read nothing (else a size,
# 0 at the end of the stream).
READ_WAIT_READABLE = -1
READ_WAIT_WRITABLE = -2
READ_CLOSED = -3

_WANT = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
# A send the socket cannot take now (a TLS write that wants the socket readable first is one):
# the bytes wait in the queue, and ``_flush`` retries them.
_WANT_WRITE = (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError)
_read_buffers = threading.local()


def _read_buffer() -> memoryview:
    """The loop thread's read buffer, shared by its connections: each read is copied out at once."""
    view: memoryview | None = getattr(_read_buffers, "view", None)
    if view is None:
        view = _read_buffers.view = memoryview(bytearray(READ_BUFFER_BYTES))
    return view


def _unread_bytes(fd: int) -> int:
    """Bytes the kernel holds for ``fd`` that were not read yet (FIONREAD)."""
    count = bytearray(4)  # a C int, written in place (an immutable argument is first tried as
    # a writable one: that failed parse, with its error text, cost more than the ioctl itself)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 1  # the read tells what is wrong
    return int.from_bytes(count, sys.byteorder)


def _tls_object(sock: socket.socket) -> Any:
    """The OpenSSL connection an ``SSLSocket`` reads and writes through, None for plain TCP (or
    a closed one). ``SSLSocket.recv_into`` and ``send`` are Python wrappers around its ``read``
    and ``write`` (three calls per read, two per send, several reads and sends per request on
    a node's hot path); called directly, only what they add is done here: a peer that closes
    without close-notify reads as the end of the stream."""
    return getattr(sock, "_sslobj", None)


def _pending(tls: Any, lock: threading.RLock) -> int:
    """Decrypted bytes OpenSSL holds, read under the transport's lock."""
    with lock:
        return int(tls.pending())


def set_nodelay(sock: socket.socket) -> None:
    """Small frames leave at once (asyncio's transports set it too)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class SocketTransport(asyncio.Transport):
    """One connection's socket (an ``SSLSocket`` once TLS is started) as an asyncio transport."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        super().__init__()
        assert not sock.getblocking()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol: asyncio.BaseProtocol | None = None
        self._peername: Any = None
        with contextlib.suppress(OSError):
            self._peername = sock.getpeername()
        self._started = False  # the protocol was told of the connection
        self._reading = False  # wanted by the protocol
        self._reader_added = False
        self._writer_added = False
        self._read_wants_write = False
        self._write_wants_read = False
        self._closing = False
        self._lost = False
        # A send that raised "want": retried with this very object before anything else.
        self._stuck: bytes | None = None
        self._queue: deque[bytes] = deque()
        self._buffered = 0
        self._high = DEFAULT_WRITE_HIGH_BYTES
        self._low = DEFAULT_WRITE_HIGH_BYTES // 4
        self._writing_paused = False
        # Where read bytes go when the protocol's reader hands them to a callback anyway
        # (``net.transport.StreamReader.sink``): straight there, without the stream protocol's
        # ``data_received`` and the reader's ``feed_data`` between (three calls per read).
        self._data_sink: Callable[[bytes], None] | None = None
        # Held around every use of the TLS object and of the write queue: a storage node's
        # disk thread writes its answers here itself (:meth:`write_from_thread`), and OpenSSL
        # allows one thread at a time on a connection. Re-entrant: a flush may fail and close.
        self._lock = threading.RLock()

    # Before the protocol: the first bytes and the TLS handshake.

    async def first_bytes(self) -> bool:
        """Wait until the peer sent something (True) or closed (False), reading nothing."""
        sock = self._sock
        while True:
            try:
                return bool(sock.recv(1, socket.MSG_PEEK))
            except (BlockingIOError, InterruptedError):
                await self._wait(readable=True)
            except OSError:
                return False

    async def start_tls(
        self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None
    ) -> None:
        """Replace the socket by an ``SSLSocket`` and drive its handshake; the caller bounds the time."""
        assert not self._started and not isinstance(self._sock, ssl.SSLSocket)
        sock = context.wrap_socket(
            self._sock,
            server_side=server_side,
            do_handshake_on_connect=False,
            server_hostname=None if server_side else server_hostname,
        )
        self._sock = sock
        while True:
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                await self._wait(readable=True)
            except ssl.SSLWantWriteError:
                await self._wait(readable=False)

    async def _wait(self, readable: bool) -> None:
        waiter = self._loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        if readable:
            self._loop.add_reader(self._fd, ready)
        else:
            self._loop.add_writer(self._fd, ready)
        try:
            await waiter
        finally:
            if readable:
                self._loop.remove_reader(self._fd)
            else:
                self._loop.remove_writer(self._fd)

    def start(self, protocol: asyncio.BaseProtocol) -> None:
        """Hand the connection to ``protocol`` and start reading."""
        assert not self._started
        self._started = True
        self._protocol = protocol
        protocol.connection_made(self)
        if not self._closing:
            self.resume_reading()

    # asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sock = self._sock
        if name == "peername":
            return self._peername
        if name == "socket":
            return sock
        if name == "sockname":
            with contextlib.suppress(OSError):
                return sock.getsockname()
            return default
        if isinstance(sock, ssl.SSLSocket):
            if name == "sslcontext":
                return sock.context
            if name == "ssl_object":
                return sock
            if name == "peercert":
                return sock.getpeercert()
            if name == "cipher":
                return sock.cipher()
        return default

    def peer_certificate_der(self) -> bytes | None:
        """The peer's certificate as DER (None: plain TCP, or the peer sent none)."""
        sock = self._sock
        if not isinstance(sock, ssl.SSLSocket):
            return None
        with contextlib.suppress(ValueError, OSError):
            return sock.getpeercert(binary_form=True)
        return None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def set_data_sink(self, sink: Callable[[bytes], None] | None) -> None:
        """Hand read bytes to ``sink`` instead of the protocol's ``data_received`` (None: to the
        protocol again). Only for a sink that is where ``data_received`` would pass them on: the
        end of the stream and errors still go to the protocol."""
        self._data_sink = sink

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False
        if self._reader_added and not self._write_wants_read:
            self._reader_added = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._closing or self._reading:
            return
        self._reading = True
        if not self._read_wants_write:
            self._add_reader()
        sock = self._sock
        if isinstance(sock, ssl.SSLSocket):
            with self._lock:
                pending = sock.pending()
            if pending:
                self._loop.call_soon(self._read_ready)  # decrypted already: no readable event will come

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = DEFAULT_WRITE_HIGH_BYTES if high is None else high
        self._low = self._high // 4 if low is None else low
        assert 0 <= self._low <= self._high

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def can_write_eof(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._closing:
            return
        chunk = data if isinstance(data, bytes) else bytes(data)
        with self._lock:
            if not self._buffered:
                # Nothing waits: straight to the socket (what ``_flush`` would do with a queue of
                # one, without the queue). What it does not take waits as before.
                sock = self._sock
                tls = getattr(sock, "_sslobj", None)
                try:
                    sent = tls.write(chunk) if tls is not None else sock.send(chunk)
                except _WANT_WRITE:
                    sent = 0
                except (OSError, ssl.SSLError) as exc:
                    self._fatal_error(exc)
                    return
                if sent == len(chunk):
                    return
                if sent:
                    chunk = chunk[sent:]  # (plain TCP only: a TLS write is all or nothing)
            self._queue.append(chunk)
            self._buffered += len(chunk)
            if self._buffered == len(chunk):
                self._flush()  # nothing was waiting: it goes now, straight from the caller's bytes
        self._pause_if_high()

    def _pause_if_high(self) -> None:
        if not self._writing_paused and self._buffered > self._high:
            self._writing_paused = True
            self._stream_protocol().pause_writing()

    def write_from_thread(self, data: bytes) -> bool:
        """:meth:`write` from a thread other than the loop's (a storage node's disk thread
        answering a batch it made durable, with no wake-up of the loop). In order with every
        other write: the bytes go to the socket at once when nothing waits, else behind what
        waits; what the socket does not take now is left to the loop. False: the connection is
        closing or not started, nothing was written (the loop's :meth:`write` drops it too)."""
        assert data
        with self._lock:
            if self._closing or self._lost or not self._started:
                return False
            if self._buffered:
                self._queue.append(data)
                self._buffered += len(data)
                return True  # the loop's flush, due already, takes it in its turn
            sock = self._sock
            tls = getattr(sock, "_sslobj", None)  # (``_tls_object``: a thread's hot path)
            try:
                sent = tls.write(data) if tls is not None else sock.send(data)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                # Retried by the loop with this very object, before anything else.
                self._stuck = data
                self._buffered = len(data)
            except (OSError, ssl.SSLError) as exc:
                self._loop.call_soon_threadsafe(self._fatal_error, exc)
                return True
            else:
                if sent == len(data):
                    return True
                self._queue.append(data[sent:])
                self._buffered = len(data) - sent
        self._loop.call_soon_threadsafe(self._flush_left_by_thread)
        return True

    def read_from_thread(self, buffer: memoryview) -> int:
        """For a thread that reads the connection in the loop's place, reading paused here (a
        storage node's data connection thread): one read into ``buffer``, under the same lock
        as every write, never blocking. The bytes read (0: the end of the stream, a peer's
        close-notify or a close without one, as Netty's), or READ_WAIT_READABLE /
        READ_WAIT_WRITABLE (OpenSSL needs the socket readable or writable first: a TLS 1.3 key
        update, a post-handshake message), or READ_CLOSED (the loop closed the connection: its
        descriptor may be gone). OSError and SSLError are the connection's failure."""
        with self._lock:
            if self._lost or self._closing:
                return READ_CLOSED
            assert not self._reading, "the loop reads this connection"
            sock = self._sock
            tls = getattr(sock, "_sslobj", None)  # (``_tls_object``: a thread's hot path)
            try:
                return int(tls.read(len(buffer), buffer) if tls is not None else sock.recv_into(buffer))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return READ_WAIT_READABLE
            except ssl.SSLWantWriteError:
                return READ_WAIT_WRITABLE
            except ssl.SSLEOFError:
                return 0  # the peer closed without close-notify (ssl.py's suppress_ragged_eofs)

    def unread_for_thread(self) -> bool:
        """Whether a read would find bytes now: OpenSSL holds decrypted ones (the selector knows
        nothing of those) or the kernel holds some. A closed connection says True, so that the
        read tells."""
        with self._lock:
            if self._lost or self._closing:
                return True
            tls = getattr(self._sock, "_sslobj", None)  # (``_tls_object``: a thread's hot path)
            return bool(tls is not None and tls.pending()) or bool(_unread_bytes(self._fd))

    def fileno(self) -> int:
        return self._fd

    def _flush_left_by_thread(self) -> None:
        with self._lock:
            if self._lost or not self._buffered or self._writer_added or self._write_wants_read:
                return  # sent meanwhile, or a flush already waits for the socket
            self._flush()
        if not self._lost:
            self._pause_if_high()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        """Unsent bytes still go (then close-notify over TLS); the protocol hears of it after."""
        if self._closing:
            return
        with self._lock:  # (a thread's write sees the close, or the close sees its bytes)
            self._closing = True
            buffered = self._buffered
        self._reading = False
        if not self._write_wants_read:  # (a stuck write waits for readability: it keeps the reader)
            self._remove_reader()
        if not buffered:
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        if self._started:
            self._force_close(None)
        elif not self._lost:
            self.abort_unstarted()

    # Reading.

    def _add_reader(self) -> None:
        if not self._reader_added:
            self._reader_added = True
            self._loop.add_reader(self._fd, self._read_ready)

    def _remove_reader(self) -> None:
        if self._reader_added:
            self._reader_added = False
            self._loop.remove_reader(self._fd)

    def _read_ready(self) -> None:
        self._read_some()
        # What the bytes read asked for at the end of the loop turn may go now (a lone
        # appender's batch), when nothing else is left to this turn.
        run_turn_end(self._loop)

    def _read_some(self) -> None:
        if self._write_wants_read:
            self._write_wants_read = False
            if not self._reading:
                self._remove_reader()
            with self._lock:
                self._flush()
        if not self._reading or self._closing or self._read_wants_write:
            return
        sock = self._sock
        view: memoryview = getattr(_read_buffers, "view", None) or _read_buffer()  # (a call less a read)
        budget = MAX_READ_PER_CALLBACK_BYTES
        tls = getattr(sock, "_sslobj", None)  # (``_tls_object``, inlined: 4 reads per commit)
        lock = self._lock
        pending = 0
        while budget > 0:
            try:
                with lock:
                    if tls is not None:
                        size = tls.read(READ_BUFFER_BYTES, view)
                        pending = tls.pending()  # (same hold: only this thread's reads change it)
                    else:
                        size = sock.recv_into(view)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                # A TLS message must leave before this read can go on.
                self._read_wants_write = True
                self._remove_reader()
                self._add_writer()
                return
            except ssl.SSLEOFError:
                size = 0  # the peer closed without close-notify (ssl.py's suppress_ragged_eofs)
            except (OSError, ssl.SSLError) as exc:
                self._fatal_error(exc)
                return
            if not size:
                self._eof()
                return
            budget -= size
            sink = self._data_sink
            if sink is not None:
                sink(view[:size].tobytes())
            else:
                self._stream_protocol().data_received(view[:size].tobytes())
            if not self._reading or self._closing:
                return
            if tls is None or pending:
                continue
            unread = bytearray(4)  # (``_unread_bytes``, inline: a call less per read)
            try:
                fcntl.ioctl(self._fd, termios.FIONREAD, unread, True)
            except OSError:
                continue  # the read tells what is wrong
            if not int.from_bytes(unread, sys.byteorder):
                # Nothing decrypted is left and the kernel holds nothing more (OpenSSL reads no
                # further than the record it returns), so the next read could only fail. Its
                # SSLWantReadError, built with OpenSSL's error text, cost more than this one
                # ioctl: 4 per commit on the server. Bytes arriving later wake the selector.
                return
        if tls is not None and _pending(tls, lock):
            self._loop.call_soon(self._read_ready)

    def _eof(self) -> None:
        self._remove_reader()
        self._reading = False
        keep_open = self._stream_protocol().eof_received()
        if not keep_open:
            self.close()

    # Writing.

    def _add_writer(self) -> None:
        if not self._writer_added:
            self._writer_added = True
            self._loop.add_writer(self._fd, self._write_ready)

    def _remove_writer(self) -> None:
        if self._writer_added:
            self._writer_added = False
            self._loop.remove_writer(self._fd)

    def _write_ready(self) -> None:
        if self._read_wants_write:
            self._read_wants_write = False
            if self._reading and not self._closing:
                self._add_reader()
                self._read_ready()
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        """Send what is buffered, the stuck bytes first, until the socket takes no more. With
        the lock held."""
        sock = self._sock
        while self._buffered and not self._lost:
            chunk = self._stuck
            if chunk is None:
                chunk = self._next_chunk()
            tls = _tls_object(sock)
            try:
                sent = tls.write(chunk) if tls is not None else sock.send(chunk)
            except ssl.SSLWantReadError:
                self._stuck = chunk
                self._write_wants_read = True
                self._remove_writer()
                self._add_reader()
                return
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._stuck = chunk
                self._add_writer()
                return
            except (OSError, ssl.SSLError) as exc:
                self._fatal_error(exc)
                return
            self._stuck = None
            self._buffered -= sent
            if sent < len(chunk):
                self._queue.appendleft(chunk[sent:])
        if self._lost:
            return
        if not self._read_wants_write:
            self._remove_writer()
        if self._writing_paused and self._buffered <= self._low:
            self._writing_paused = False
            self._stream_protocol().resume_writing()
        if self._closing and not self._buffered:
            self._loop.call_soon(self._connection_lost, None)

    def _next_chunk(self) -> bytes:
        """The queue's first bytes, joined up to :data:`MAX_SEND_BYTES`, taken off the queue."""
        queue = self._queue
        first = queue.popleft()
        if not queue or len(first) >= MAX_SEND_BYTES:
            return first
        pieces = [first]
        size = len(first)
        while queue and size + len(queue[0]) <= MAX_SEND_BYTES:
            piece = queue.popleft()
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces)

    # Ending.

    def _stream_protocol(self) -> asyncio.Protocol:
        protocol = self._protocol
        assert isinstance(protocol, asyncio.Protocol)
        return protocol

    def _fatal_error(self, exc: BaseException) -> None:
        if not isinstance(exc, (OSError, ssl.SSLError)):
            log.error("fatal error on a connection to %s", self._peername, exc_info=exc)
        self._force_close(exc if isinstance(exc, Exception) else None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        with self._lock:
            self._stuck = None
            self._queue.clear()
            self._buffered = 0
            self._closing = True
        self._remove_reader()
        self._remove_writer()
        self._read_wants_write = self._write_wants_read = False
        self._closing = True
        self._loop.call_soon(self._connection_lost, exc, False)

    def _connection_lost(self, exc: Exception | None, goodbye: bool = True) -> None:
        if self._lost:
            return
        with self._lock:
            self._lost = True
        self._remove_reader()
        self._remove_writer()
        sock = self._sock
        if goodbye and isinstance(sock, ssl.SSLSocket):
            # Close-notify, without waiting for the peer's (the socket is non-blocking). (No
            # thread writes any more: the connection is lost under the lock.)
            with contextlib.suppress(OSError, ssl.SSLError, ValueError):
                sock.unwrap()
        try:
            if self._started and self._protocol is not None:
                self._protocol.connection_lost(exc)
        finally:
            sock.close()
            self._protocol = None

    def abort_unstarted(self) -> None:
        """Close a connection no protocol was started on, at once (a failed handshake)."""
        assert not self._started
        self._lost = self._closing = True
        self._remove_reader()
        self._remove_writer()
        # Bytes left unread make the kernel answer the close with a reset; a peer that sent
        # garbage instead of TLS sees the end of the stream instead (as it did when asyncio
        # read its first bytes whole).
        with contextlib.suppress(OSError):
            for _ in range(MAX_DRAIN_READS):
                if not socket.socket.recv(self._sock, READ_BUFFER_BYTES):
                    break
        self._sock.close()
