"""Listening and connecting sockets for :class:`SocketTransport` (issue 33): raw sockets accepted
here, each waited on for readability before any TLS state exists (the idle-flood bound), and
outgoing connections driven by the same transport."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from waltz_engine.net.socket_transport import (
    ACCEPT_RETRY_DELAY_S,
    LISTEN_BACKLOG,
    MAX_ACCEPTS_PER_CALLBACK,
    SocketTransport,
    set_nodelay,
)

log = logging.getLogger(__name__)


class SocketServer:
    """Listening sockets whose connections are accepted here, each a :class:`SocketTransport`
    handed to a new protocol (``connection_made``) before anything is read from it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        socks: Sequence[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
    ) -> None:
        self._loop = loop
        self._socks = list(socks)
        self._factory = protocol_factory
        self._paused: dict[int, asyncio.TimerHandle] = {}
        for sock in self._socks:
            loop.add_reader(sock.fileno(), self._accept_ready, sock)

    @property
    def sockets(self) -> Sequence[socket.socket]:
        return tuple(self._socks)

    def close(self) -> None:
        socks, self._socks = self._socks, []
        for sock in socks:
            retry = self._paused.pop(sock.fileno(), None)
            if retry is not None:
                retry.cancel()
            else:
                self._loop.remove_reader(sock.fileno())
            sock.close()

    async def wait_closed(self) -> None:
        return None

    def _accept_ready(self, sock: socket.socket) -> None:
        for _ in range(MAX_ACCEPTS_PER_CALLBACK):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    delay_s = ACCEPT_RETRY_DELAY_S
                    log.error("out of resources accepting connections (%s); pausing %.0f s", exc, delay_s)
                    self._loop.remove_reader(sock.fileno())
                    self._paused[sock.fileno()] = self._loop.call_later(delay_s, self._resume, sock)
                    return
                raise
            conn.setblocking(False)
            set_nodelay(conn)
            transport = SocketTransport(self._loop, conn)
            protocol = self._factory()
            transport.set_protocol(protocol)
            protocol.connection_made(transport)

    def _resume(self, sock: socket.socket) -> None:
        if self._paused.pop(sock.fileno(), None) is not None and sock in self._socks:
            self._loop.add_reader(sock.fileno(), self._accept_ready, sock)


async def listen(protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int) -> SocketServer:
    """A :class:`SocketServer` on ``host:port`` as asyncio's ``create_server`` binds it: each address
    ``host`` resolves to (all interfaces for ``""``); port 0 takes one free port on the first."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    if port == 0:
        infos = infos[:1]
    socks: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return SocketServer(loop, socks, protocol_factory)


async def connect_socket(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to ``host:port`` (each resolved address in turn)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        set_nodelay(sock)
        return sock
    if len(errors) == 1:
        raise errors[0]
    if errors and len({str(e) for e in errors}) == 1:
        raise errors[0]
    raise OSError(f"cannot connect to {host}:{port}: {'; '.join(map(str, errors)) or 'no address'}")


async def open_connection(
    host: str, port: int, ssl_context: ssl.SSLContext | None, protocol: asyncio.BaseProtocol
) -> SocketTransport:
    """Connect, do the TLS handshake when ``ssl_context`` is given, then start ``protocol``."""
    loop = asyncio.get_running_loop()
    transport = SocketTransport(loop, await connect_socket(host, port))
    try:
        if ssl_context is not None:
            await transport.start_tls(ssl_context, server_side=False, server_hostname=host)
    except BaseException:
        transport.abort_unstarted()
        raise
    transport.start(protocol)
    return transport
