"""The one thing the client needs from a connection, so the mock driver can stand in for TCP."""

from __future__ import annotations

from typing import Protocol

from waltz_engine.net.channel import FramedConnection
from waltz_engine.wire.client_messages import ClientMessage


class Channel(Protocol):
    """Messages to and from one server; ``write`` queues, ``drain`` waits while the buffer is full."""

    @property
    def closed(self) -> bool: ...

    def write(self, messages: list[ClientMessage]) -> None: ...

    async def drain(self) -> None: ...

    async def receive(self) -> ClientMessage | None: ...

    async def close(self) -> None: ...


class FramedChannel:
    """A real TLS connection speaking the 'L' codec negotiated in the Hello."""

    __slots__ = ("_conn",)

    def __init__(self, conn: FramedConnection) -> None:
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def version(self) -> int:
        return self._conn.version

    def write(self, messages: list[ClientMessage]) -> None:
        encode = self._conn.codec.encode_frame
        # One buffer, one socket write for everything queued in this turn of the loop.
        self._conn.send_frame(b"".join([encode(message) for message in messages]))

    async def drain(self) -> None:
        await self._conn.drain()

    async def receive(self) -> ClientMessage | None:
        message: ClientMessage | None = await self._conn.receive()
        return message

    async def close(self) -> None:
        await self._conn.close()
