"""A port a node listens on (:func:`waltz_engine.net.channel.serve` makes it), with the tasks of
its open connections, so that stopping a node can end them."""

from __future__ import annotations

import asyncio
from typing import Any

from waltz_engine.net.connection_limits import ConnectionGate
from waltz_engine.net.transport import ServerHandle


class Listener:
    """A port :func:`serve` listens on, and the tasks of its open connections (one each, from
    accept to the handler's return), so that stopping a node can end them."""

    def __init__(
        self, server: ServerHandle, connections: set[asyncio.Task[None]], gate: ConnectionGate
    ) -> None:
        self.server = server
        self.connections = connections
        self.gate = gate

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
