"""SimNetwork under the product's own framing: channel.serve and channel.connect (Hello handshake,
FramedConnection) between simulated hosts, in virtual time, with the network's faults."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from waltz_engine.net.channel import (
    ConnectionClosedError,
    FramedConnection,
    Listener,
    connect,
    serve,
)
from waltz_engine.net.connection_limits import ConnectionGate, ConnectionLimits
from waltz_engine.sim.loop import SimLoop, run
from waltz_engine.sim.network import STALL_RESET_S, Latency, SimNetwork
from waltz_engine.wire.storage_messages import STORAGE_CODEC, StorageOpenRequest

STORAGE = {0: STORAGE_CODEC}
PORT = 6000
ONE_WAY_S = 0.005
BATCH_FRAMES = 100
MAX_BATCHES = 1_000
FIXED_LATENCY = Latency(ONE_WAY_S, ONE_WAY_S)


def _message(n: int) -> StorageOpenRequest:
    return StorageOpenRequest(n, n, -1, uuid.UUID(int=7), 4)


class Echo:
    """A storage host echoing every message; it records what it saw and how its connection ended."""

    def __init__(self, greet: bool = False) -> None:
        self.received: list[Any] = []
        self.ended: list[str] = []
        self.finished = asyncio.Event()
        self.greet = greet

    async def __call__(self, conn: FramedConnection) -> None:
        try:
            if self.greet:
                await conn.send(_message(-1))
            while (msg := await conn.receive()) is not None:
                self.received.append(msg)
                await conn.send(msg)
            self.ended.append("eof")
        except ConnectionError as e:
            self.ended.append(type(e).__name__)
            raise
        finally:
            self.finished.set()


def _simulate(
    scenario: Callable[[SimNetwork, Echo, Listener], Awaitable[Any]],
    latency: Latency = FIXED_LATENCY,
    echo: Echo | None = None,
    seed: int = 1,
    limits: ConnectionLimits | None = None,
) -> tuple[Any, SimLoop]:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        network = SimNetwork(loop, latency)
        handler = echo or Echo()
        listener = await serve(
            "0.0.0.0",
            PORT,
            None,
            STORAGE,
            "Waltz Storage Server",
            handler,
            "storage",
            ConnectionGate(limits),
            network.node("storage"),
        )
        try:
            return await scenario(network, handler, listener)
        finally:
            listener.close()
            await listener.end_connections(1.0)

    return run(seed, main)


async def _connect(network: SimNetwork, timeout_ms: int = 10_000) -> FramedConnection:
    return await connect(
        "storage", PORT, None, STORAGE, "Waltz Storage Client", timeout_ms, network.node("server")
    )


def test_handshake_and_frames_cross_in_the_links_time() -> None:
    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> tuple[float, str, str]:
        loop = asyncio.get_running_loop()
        conn = await _connect(network)
        assert conn.peer_hello.message == "Waltz Storage Server" and conn.version == 0
        sent_at = loop.time()
        await conn.send(_message(1))
        assert await conn.receive() == _message(1)
        round_trip_s = loop.time() - sent_at
        await conn.close()
        return round_trip_s, conn.peer, listener.sockets[0].getsockname()[0]

    (round_trip_s, peer, host), _ = _simulate(scenario)
    assert round_trip_s == pytest.approx(2 * ONE_WAY_S)
    assert peer == f"storage:{PORT}" and host == "storage"


def test_frames_arrive_in_order_whatever_each_ones_delay() -> None:
    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> list[Any]:
        conn = await _connect(network)
        for n in range(200):
            conn.send_frame(STORAGE_CODEC.encode_frame(_message(n)))
            await asyncio.sleep(0)
        replies = [await conn.receive() for _ in range(200)]
        await conn.close()
        return replies

    replies, _ = _simulate(scenario, Latency(0.000_1, 0.05))
    assert replies == [_message(n) for n in range(200)]


def test_a_reset_is_seen_by_both_sides() -> None:
    echo = Echo()

    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> str:
        conn = await _connect(network)
        await conn.send(_message(1))
        assert await conn.receive() == _message(1)
        network.reset("server", "storage")
        try:
            await conn.receive()
        except ConnectionError as e:
            await echo.finished.wait()
            return str(e)
        finally:
            await conn.close()
        return "no error"

    error, loop = _simulate(scenario, echo=echo)
    assert "connection reset (fault)" in error
    assert echo.ended == ["ConnectionResetError"]
    assert any(e.kind == "fault" and e.detail == "reset server <-> storage" for e in loop.tail)


def test_a_partition_stalls_then_resets_the_connection() -> None:
    echo = Echo()

    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> tuple[float, str]:
        loop = asyncio.get_running_loop()
        conn = await _connect(network)
        network.partition("server", "storage")
        sent_at = loop.time()
        await conn.send(_message(1))
        try:
            await conn.receive()
        except ConnectionError as e:
            await echo.finished.wait()
            return loop.time() - sent_at, str(e)
        finally:
            await conn.close()
        return 0.0, "no error"

    (stalled_s, error), _ = _simulate(scenario, echo=echo)
    assert stalled_s == pytest.approx(STALL_RESET_S)
    assert "connection reset (stalled)" in error
    assert echo.received == [] and echo.ended == ["ConnectionResetError"]


def test_a_partition_healed_in_time_delivers_the_stalled_frames_in_order() -> None:
    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> list[Any]:
        conn = await _connect(network)
        network.partition("server", "storage")
        for n in range(3):
            await conn.send(_message(n))
        await asyncio.sleep(STALL_RESET_S / 2)
        assert echo.received == []
        network.heal("server", "storage")
        replies = [await conn.receive() for _ in range(3)]
        await conn.close()
        return replies

    replies, _ = _simulate(scenario)
    assert replies == [_message(n) for n in range(3)]


def test_one_way_loss_lets_the_other_way_through_then_resets() -> None:
    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> tuple[Any, str]:
        conn = await _connect(network)
        network.drop("server", "storage")
        greeting = await conn.receive()  # storage -> server still flows
        await conn.send(_message(1))
        try:
            await conn.receive()
        except ConnectionError as e:
            return greeting, str(e)
        finally:
            await conn.close()
        return greeting, "no error"

    (greeting, error), _ = _simulate(scenario, echo=Echo(greet=True))
    assert greeting == _message(-1)
    assert "connection reset (stalled)" in error


def test_connecting_to_nothing_is_refused_and_across_a_partition_times_out() -> None:
    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> list[str]:
        loop = asyncio.get_running_loop()
        errors = []
        for fault in ("refused", "partition"):
            if fault == "refused":
                listener.close()
            else:
                network.partition("server", "storage")
            started = loop.time()
            with pytest.raises(ConnectionClosedError) as failed:
                await _connect(network, timeout_ms=2_000)
            errors.append(f"{failed.value} after {loop.time() - started:.3f} s")
        return errors

    errors, _ = _simulate(scenario)
    assert (
        errors[0]
        == f"cannot connect to storage:{PORT}: [Errno 111] connect to storage:{PORT} refused after 0.010 s"
    )
    assert errors[1] == f"no answer from storage:{PORT} within 2000 ms after 2.000 s"


def test_a_reader_that_stops_reading_pauses_the_writer() -> None:
    """The client stops reading: the echo's writes back fill, the echo stops reading, then the
    client's own writes wait; all of it arrives once the client reads again."""

    async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> tuple[int, list[Any]]:
        conn = await _connect(network)
        transport = conn.writer.transport
        transport.pause_reading()
        frames = [STORAGE_CODEC.encode_frame(_message(n)) for n in range(BATCH_FRAMES)]
        batches = 0
        while batches < MAX_BATCHES:
            conn.send_frames(frames)
            batches += 1
            drain = asyncio.ensure_future(conn.drain())
            await asyncio.sleep(1.0)
            if not drain.done():
                break
        transport.resume_reading()
        replies = [await conn.receive() for _ in range(batches * BATCH_FRAMES)]
        await drain
        await conn.close()
        return batches, replies

    (batches, replies), _ = _simulate(scenario, limits=ConnectionLimits(max_buffered_bytes=64 * 1024))
    assert 1 < batches < MAX_BATCHES
    assert replies == [_message(n) for n in range(BATCH_FRAMES)] * batches


def test_one_seed_one_trace() -> None:
    def once(seed: int) -> str:
        async def scenario(network: SimNetwork, echo: Echo, listener: Listener) -> None:
            conn = await _connect(network)
            for n in range(20):
                await conn.send(_message(n))
                await conn.receive()
            network.reset("server", "storage")
            await conn.close()

        return _simulate(scenario, Latency(0.000_1, 0.01), seed=seed)[1].trace_hash

    assert once(5) == once(5) != once(6)
