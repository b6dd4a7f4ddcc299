"""An asyncio TCP proxy for fault injection (the original's ``ProxyServer``): forwards bytes,
can cut or refuse connections. The smoke test puts one in front of every node; tests put one
between any two peers. It may listen on a given port: a storage node's proxy must listen on the
port registered for the node in ZooKeeper.

``disconnect_all()`` aborts every proxied connection (both sides); ``refuse = True`` makes new
connections close at once (a node that is "down" without stopping its process). Bounded: at
most ``MAX_CONNECTIONS`` at a time, one read of ``CHUNK_BYTES`` in flight per direction.
"""

from __future__ import annotations

import asyncio
import contextlib

HOST = "127.0.0.1"
MAX_CONNECTIONS = 64
CHUNK_BYTES = 64 * 1024
ANY_PORT = 0


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int = ANY_PORT) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_port = listen_port
        self.refuse = False
        self.num_disconnects = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def num_connections(self) -> int:
        """Proxied connections open right now."""
        return len(self._pairs)

    @property
    def connect_string(self) -> str:
        return f"{HOST}:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, HOST, self.listen_port)
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse or len(self._pairs) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()  # the target is down: so is its proxied port
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)
            writer.transport.abort()
            up_writer.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(CHUNK_BYTES):
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()

    def disconnect_all(self) -> int:
        """Abort every proxied connection now; how many there were."""
        pairs = list(self._pairs)
        # Gone from the count now, not when their pipes notice a turn or more later: a caller
        # that waits for a connection and then cuts must not count one already cut.
        self._pairs.clear()
        for client_side, server_side in pairs:
            client_side.transport.abort()
            server_side.transport.abort()
        self.num_disconnects += len(pairs)
        return len(pairs)

    async def close(self) -> None:
        self.disconnect_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
