"""One connection to one server, reconnecting until closed (the original's WaltzNetworkClient).

A network client is never reused after its connection drops: its owner replaces it with a
new one whose ``seq_num`` is one higher, so the server can tell stale connections apart
(reference §2.4). Only a failed connect is retried in place, after the reconnect delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol

from waltz_engine.client.channel import Channel
from waltz_engine.common.errors import WaltzError
from waltz_engine.wire.client_messages import ClientMessage

log = logging.getLogger(__name__)

Endpoint = str  # "host:port", as the cluster manager publishes it (waltz_engine.common.address parses it)
OpenChannel = Callable[[Endpoint], Awaitable[Channel]]


class NetworkClientOwner(Protocol):
    def on_channel_ready(self, network_client: NetworkClient) -> None: ...

    async def on_message(self, network_client: NetworkClient, message: ClientMessage) -> None: ...

    def on_disconnected(self, network_client: NetworkClient) -> None: ...


class NetworkClient:
    def __init__(
        self,
        endpoint: Endpoint,
        seq_num: int,
        open_channel: OpenChannel,
        owner: NetworkClientOwner,
        reconnect_delay_ms: int,
    ) -> None:
        self.endpoint = endpoint
        self.seq_num = seq_num
        self._open_channel = open_channel
        self._owner = owner
        self._reconnect_delay_ms = reconnect_delay_ms
        self._channel: Channel | None = None
        self._outbox: list[ClientMessage] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"NetworkClient({self.endpoint}, seq={self.seq_num})"

    @property
    def ready(self) -> bool:
        return self._channel is not None and not self._channel.closed and not self._closed

    def start(self) -> None:
        assert self._task is None, "start() once"
        self._task = asyncio.create_task(self._run(), name=f"waltz-client {self.endpoint} seq={self.seq_num}")

    def send(self, message: ClientMessage) -> bool:
        """Queue ``message``; all queued in one loop turn leave in one write. False if not connected."""
        if not self.ready:
            return False
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._write_outbox)
        self._outbox.append(message)
        return True

    async def drain(self) -> None:
        """Wait while the connection's send buffer is above its high-water mark."""
        channel = self._channel
        if channel is not None and not channel.closed:
            self._write_outbox()
            with contextlib.suppress(WaltzError, ConnectionError):
                await channel.drain()

    def _write_outbox(self) -> None:
        messages, self._outbox = self._outbox, []
        channel = self._channel
        if not messages or channel is None or channel.closed:
            return
        try:
            channel.write(messages)
        except (WaltzError, ConnectionError) as e:
            # The reader sees the broken connection too and reports it to the owner.
            log.info("%r: send failed: %s", self, e)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._channel is not None:
            await self._channel.close()

    async def _run(self) -> None:
        channel = await self._connect()
        if channel is None:
            return
        self._channel = channel
        try:
            self._owner.on_channel_ready(self)
            while not self._closed:
                message = await channel.receive()
                if message is None:
                    log.info("%r: server closed the connection", self)
                    break
                await self._owner.on_message(self, message)
        except (WaltzError, ConnectionError, ssl.SSLError) as e:
            log.warning("%r: connection lost: %s", self, e)
        finally:
            await channel.close()
            if not self._closed:
                self._closed = True
                self._owner.on_disconnected(self)

    async def _connect(self) -> Channel | None:
        while not self._closed:
            try:
                return await self._open_channel(self.endpoint)
            except (WaltzError, OSError) as e:
                log.info("%r: cannot connect (retrying in %d ms): %s", self, self._reconnect_delay_ms, e)
            await asyncio.sleep(self._reconnect_delay_ms / 1000)
        return None
