"""Framed TLS connections over real loopback sockets."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import JOIN_LIMIT_BYTES, ConnectionClosedError, FramedConnection, connect, serve
from waltz_engine.net.tls import TlsConfig, client_context, server_context
from waltz_engine.wire.client_messages import CLIENT_CODECS
from waltz_engine.wire.errors import HandshakeFailedError
from waltz_engine.wire.hello import HELLO_CODEC, Hello
from waltz_engine.wire.storage_messages import STORAGE_CODEC, StorageAppendRequest, StorageOpenRequest

STORAGE = {0: STORAGE_CODEC}


async def _echo_server(received: list[Any], closed: asyncio.Event) -> tuple[asyncio.Server, int]:
    async def handler(conn: FramedConnection) -> None:
        try:
            while (msg := await conn.receive()) is not None:
                received.append(msg)
                await conn.send(msg)
        finally:
            closed.set()

    server = await serve(
        "127.0.0.1", 0, server_context(TlsConfig()), STORAGE, "Waltz Storage Server", handler, "test"
    )
    return server, server.sockets[0].getsockname()[1]


def test_handshake_and_round_trip() -> None:
    async def go() -> None:
        received: list[Any] = []
        server, port = await _echo_server(received, asyncio.Event())
        try:
            conn = await connect(
                "127.0.0.1", port, client_context(TlsConfig()), STORAGE, "Waltz Storage Client"
            )
            assert conn.peer_hello.message == "Waltz Storage Server" and conn.version == 0
            msg = StorageOpenRequest(-1, -1, -1, uuid.UUID(int=7), 4)
            await conn.send(msg)
            assert await conn.receive() == msg
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()
        assert received == [msg]

    asyncio.run(go())


def test_no_common_version_fails_the_handshake_and_the_server_keeps_serving() -> None:
    async def go() -> None:
        server, port = await _echo_server([], asyncio.Event())
        try:
            with pytest.raises(HandshakeFailedError):
                await connect("127.0.0.1", port, client_context(TlsConfig()), {4: CLIENT_CODECS[4]}, "x")
            conn = await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "ok")
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def test_second_hello_and_garbage_close_only_that_connection() -> None:
    async def go() -> None:
        closed = asyncio.Event()
        server, port = await _echo_server([], closed)
        try:
            conn = await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "x")
            conn.send_frame(HELLO_CODEC.encode_frame(Hello((0,), "again")))
            await conn.drain()
            assert await asyncio.wait_for(conn.receive(), 5) is None  # server closed it
            await asyncio.wait_for(closed.wait(), 5)
            # Raw garbage instead of a TLS handshake, then a healthy client.
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x00garbage" * 100)
            await writer.drain()
            writer.close()
            good = await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "y")
            await good.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def test_connect_to_a_closed_port_is_a_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionClosedError, match=f"cannot connect to 127.0.0.1:{port}"):
        asyncio.run(connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "x", timeout_ms=2000))


def test_garbage_instead_of_tls_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        closed = asyncio.Event()
        server, port = await _echo_server([], closed)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            writer.close()
        finally:
            server.close()
            await server.wait_closed()

    with caplog.at_level("WARNING", logger="waltz_engine.net.channel"):
        asyncio.run(go())
    assert any("TLS handshake failed" in r.getMessage() for r in caplog.records)


def test_send_frames_joins_pieces_that_fit_one_tls_record_and_passes_larger_ones_as_they_are() -> None:
    small = StorageOpenRequest(-1, -1, -1, uuid.UUID(int=7), 4)
    data = bytes(range(256)) * ((JOIN_LIMIT_BYTES // 256) + 1)  # one frame above the limit
    large = StorageAppendRequest(1, 2, 0, (Record(0, ReqId(1, 2, 3, 4), 0, data, zlib.crc32(data)),), False)

    def pieces(message: Any) -> list[bytes]:
        frame = STORAGE_CODEC.encode_frame(message)
        return [frame[:5], frame[5:20], frame[20:]]

    async def go() -> None:
        received: list[Any] = []
        server, port = await _echo_server(received, asyncio.Event())
        try:
            conn = await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "x")
            writes: list[str] = []
            transport: Any = conn.writer.transport  # written to directly, past the stream writer
            write, writelines = transport.write, transport.writelines
            inner: list[bool] = []  # within writelines (whose own writes are not the connection's)

            def spy_write(data: bytes) -> None:
                if not inner:
                    writes.append("write")
                write(data)

            def spy_writelines(data: list[bytes]) -> None:
                writes.append("writelines")
                inner.append(True)
                try:
                    writelines(data)
                finally:
                    inner.pop()

            transport.write, transport.writelines = spy_write, spy_writelines
            conn.send_frames(pieces(small))
            conn.send_frames(pieces(large))
            await conn.drain()
            assert await conn.receive() == small
            assert await conn.receive() == large
            assert writes == ["write", "writelines"]
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()
        assert received == [small, large]

    asyncio.run(go())


def test_coalesced_frames_leave_in_one_write_at_the_end_of_the_turn_and_in_order() -> None:
    first = StorageOpenRequest(-1, 1, 0, uuid.UUID(int=1), 4)
    second = StorageOpenRequest(-1, 2, 1, uuid.UUID(int=2), 4)
    third = StorageOpenRequest(-1, 3, 2, uuid.UUID(int=3), 4)

    async def go() -> None:
        received: list[Any] = []
        server, port = await _echo_server(received, asyncio.Event())
        try:
            conn = await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "x")
            busy = False
            conn.coalesce_writes(lambda: busy)
            conn.send_frames([STORAGE_CODEC.encode_frame(first)])
            assert conn.writes == 1  # not busy: at once
            busy = True
            conn.send_frames([STORAGE_CODEC.encode_frame(second)])
            conn.send_frames([STORAGE_CODEC.encode_frame(third)])
            assert conn.writes == 1
            await asyncio.sleep(0)  # the end of this loop turn
            assert conn.writes == 2
            conn.send_frames([STORAGE_CODEC.encode_frame(second)])
            conn.send_frame(STORAGE_CODEC.encode_frame(first))  # not before what waits
            assert [await conn.receive() for _ in range(5)] == [first, second, third, second, first]
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


async def _storage_server(handler: Callable[[FramedConnection], Awaitable[None]]) -> asyncio.Server:
    return await serve(
        "127.0.0.1", 0, server_context(TlsConfig()), STORAGE, "Waltz Storage Server", handler, "test"
    )


async def _connect(server: asyncio.Server) -> FramedConnection:
    port = server.sockets[0].getsockname()[1]
    return await connect("127.0.0.1", port, client_context(TlsConfig()), STORAGE, "c")


def _appends(sizes: list[int]) -> list[StorageAppendRequest]:
    """One APPEND per size, each with one record of that many bytes."""
    return [
        StorageAppendRequest(1, i, 0, (Record(i, ReqId(1, 1, 0, i), 0, bytes(size), 0),), False)
        for i, size in enumerate(sizes)
    ]


def test_large_frames_both_ways_at_once_arrive_whole_and_in_order() -> None:
    """Megabytes each way with neither side waiting for the other: the TLS transport's partial
    and refused writes (resent as the same bytes), its buffered reads and a server handling
    frames in its read callback (``dispatch``)."""
    sizes = [1, 100, 16 * 1024, 16 * 1024 + 1, 300_000, 1_000_000] * 2

    async def go() -> None:
        async def handler(conn: FramedConnection) -> None:
            ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

            def echo(message: Any) -> None:
                conn.send_frame(STORAGE_CODEC.encode_frame(message))

            conn.dispatch(echo, lambda error: ended.done() or ended.set_result(error))
            assert await ended is None

        server = await _storage_server(handler)
        try:
            conn = await _connect(server)
            sent = _appends(sizes)

            async def send_all() -> None:
                for message in sent:
                    conn.send_frame(STORAGE_CODEC.encode_frame(message))
                await conn.drain()

            sending = asyncio.create_task(send_all())
            received = [await conn.receive() for _ in sent]
            await sending
            assert received == sent
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def test_frames_sent_from_a_thread_and_from_the_loop_at_once_arrive_whole_and_in_order() -> None:
    """A storage node's disk thread writes its answers to the socket itself
    (``send_frames_from_thread``) while the loop writes others on the same connection: each
    side's frames arrive whole and in its order, large ones included (the thread's write that
    the socket refuses is finished by the loop, as the same bytes, before anything after it)."""
    sizes = [1, 100, 16 * 1024 + 1, 300_000, 1_000_000, 5] * 3

    async def go() -> None:
        async def handler(conn: FramedConnection) -> None:
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[BaseException | None] = loop.create_future()
            jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

            def answer_from_thread() -> None:
                while (message := jobs.get()) is not None:
                    conn.send_frames_from_thread([STORAGE_CODEC.encode_frame(message)], loop)

            # A small send buffer: the thread's writes find the socket full and leave the rest to the loop.
            conn.writer.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 8192
            )
            thread = threading.Thread(target=answer_from_thread)
            thread.start()

            def on_message(message: Any) -> None:
                jobs.put(message)
                conn.send_frame(
                    STORAGE_CODEC.encode_frame(
                        StorageOpenRequest(-1, message.seq_num, 0, uuid.UUID(int=1), 4)
                    )
                )

            conn.dispatch(on_message, lambda error: ended.done() or ended.set_result(error))
            try:
                assert await ended is None
            finally:
                jobs.put(None)
                await asyncio.to_thread(thread.join)

        server = await _storage_server(handler)
        try:
            conn = await _connect(server)
            sent = _appends(sizes)
            for message in sent:
                conn.send_frame(STORAGE_CODEC.encode_frame(message))
            await conn.drain()
            await asyncio.sleep(0.2)  # the server's writes fill the socket meanwhile
            received = [await conn.receive() for _ in range(2 * len(sent))]
            assert [m for m in received if type(m) is StorageAppendRequest] == sent
            assert [m.seq_num for m in received if type(m) is StorageOpenRequest] == list(range(len(sent)))
            await conn.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


@pytest.mark.parametrize("during_a_task", [False, True], ids=["from-a-loop-callback", "during-another-task"])
def test_a_coroutine_finalized_closes_its_connection_without_waiting(
    during_a_task: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The garbage collector closes a coroutine whose task is gone, from no task at all or
    during some other task's step (a collection starts at any allocation): its ``finally``
    closes the connection and must not wait. Outside a task asyncio.timeout raised "Timeout
    should be used inside a task" (printed as an ignored exception at simulated worlds'
    teardown); during another task it bound that task, the coroutine "ignored GeneratorExit",
    and the timeout cancelled the innocent task later."""
    monkeypatch.setattr("waltz_engine.net.channel.HANDSHAKE_TIMEOUT_MS", 1)

    async def holder(conn: FramedConnection) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await conn.close()

    async def go() -> None:
        server = await _storage_server(lambda conn: conn.receive())
        try:
            conn = await _connect(server)
            coroutine = holder(conn)
            coroutine.send(None)  # suspended in the wait, owned by no task
            loop = asyncio.get_running_loop()
            finalized = loop.create_future()

            def finalize() -> None:  # as the collector's finalizers run
                try:
                    coroutine.close()
                except BaseException as e:
                    finalized.set_result(e)
                else:
                    finalized.set_result(None)

            async def innocent() -> None:
                finalize()
                await asyncio.sleep(0.05)  # past the 1 ms bound a wait would have set

            if during_a_task:
                await loop.create_task(innocent())  # not cancelled
            else:
                loop.call_soon(finalize)
            assert await finalized is None
            assert conn.writer.is_closing()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())
