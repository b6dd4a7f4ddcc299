"""The fault-injection proxy's count of live connections, which fault tests wait on before a cut."""

from __future__ import annotations

import asyncio

from waltz_engine.net.tcp_proxy import HOST, TcpProxy

WAIT_S = 10.0
POLL_S = 0.01


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
    writer.close()


def test_a_cut_connection_leaves_the_count_at_once() -> None:
    """A caller that waits for a connection and then cuts must not see one it already cut."""

    async def go() -> None:
        target = await asyncio.start_server(_echo, HOST, 0)
        proxy = await TcpProxy(HOST, target.sockets[0].getsockname()[1]).start()
        try:
            reader, writer = await asyncio.open_connection(HOST, proxy.port)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), WAIT_S) == b"ping"
            assert proxy.num_connections == 1
            assert proxy.disconnect_all() == 1
            # No turn of the loop in between: the pipes have not yet seen the abort.
            assert proxy.num_connections == 0
            assert proxy.disconnect_all() == 0
            writer.close()
        finally:
            await proxy.close()
            target.close()
            await target.wait_closed()

    asyncio.run(asyncio.wait_for(go(), WAIT_S * 2))
