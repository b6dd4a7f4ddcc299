"""Many clients at once (issue 13, item 6), with real processes and sockets.

A hundred Java WaltzClients mounting partition 0 of our server together: 98 gave up after their
10 s mount timeout, the original's server mounted them all. Here 200 clients speak the protocol
as a Java client does (TLS, Hello, MountRequest from high-water mark -1 over a backlog of 10 000
transactions) to a real server over three real storage nodes, all at once; every one must get
the whole backlog in order and READY, side by side (none starved), at a bounded cost to the
server. The clients only count and checksum the feed bytes, so the server's work is what counts.
Before the fix: 27.5-28 s for all (every Java client would have given up), 11+ s of server CPU.
"""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config

from waltz_engine.bench.process_cpu import cpu_seconds
from waltz_engine.client import WaltzClient
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import FramedConnection, connect
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    CURRENT_CLIENT_VERSION,
    PARTITION_STATE_READY,
    FeedData,
    MountRequest,
    MountResponse,
)
from waltz_engine.wire.frame import FrameDecoder
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT

NUM_CLIENTS = 200
BACKLOG_TRANSACTIONS = 10_000
BACKLOG_IN_FLIGHT = 500
# Bounds far from the expected figures (about 1 s for all, 0.4 s of server CPU on 2 cores), so a
# loaded machine does not fail them; the 2 s goal is `waltz bench producers --mount-storm`'s.
ALL_MOUNTED_BOUND_S = 60.0
# Served one after another, the last would take about 200 times the first; side by side, about
# the same. A loaded machine (this process reads all 200 feeds) once stretched the spread past
# 2x + 2 s, so the bound is set well between the two.
STARVATION_FACTOR = 10.0
STARVATION_SLACK_S = 5.0
SERVER_CPU_BOUND_S = 4.0
SETUP_TIMEOUT_S = 120.0
CONNECT_CONCURRENCY = 20
READ_CHUNK_BYTES = 64 * 1024
FIRST_CLIENT_ID = 1_000
NETWORK_CLIENT_SEQ_NUM = 1
PARTITION = 0
GENERATION = 1  # a fresh cluster's first assignment (the server does not check a mount's)


async def _backlog(client: WaltzClient) -> None:
    contexts = []
    for i in range(BACKLOG_TRANSACTIONS):
        context = MockContext(f"backlog-{i}", partition=PARTITION)
        await client.submit(context)
        contexts.append(context)
    for context in contexts:
        assert await context.result(SETUP_TIMEOUT_S)


async def _connect_all() -> list[FramedConnection]:
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)
    port_of = _connect_all.port  # type: ignore[attr-defined]

    async def one() -> FramedConnection:
        async with slots:
            return await connect(
                "127.0.0.1",
                port_of,
                client_context(TlsConfig()),
                {CURRENT_CLIENT_VERSION: CLIENT_CODECS[CURRENT_CLIENT_VERSION]},
                CLIENT_HELLO_TEXT,
            )

    return await asyncio.gather(*(one() for _ in range(NUM_CLIENTS)))


class _Mount:
    """One client's mount: the feed bytes it got (counted, checksummed) and when READY came."""

    def __init__(self, conn: FramedConnection, client_id: int) -> None:
        self.conn = conn
        self.req_id = ReqId(client_id, GENERATION, PARTITION, 0)
        self.ready = conn.codec.encode_frame(MountResponse(self.req_id, PARTITION_STATE_READY))
        # Every FeedData frame has the same size (fixed fields only).
        frame_size = len(conn.codec.encode_frame(FeedData(self.req_id, 0, 0)))
        self.feed_bytes = BACKLOG_TRANSACTIONS * frame_size
        self.crc = 0
        self.mounted_after_s: float | None = None
        self.sample = bytearray()  # the first client keeps its whole feed to decode it

    async def run(self, started_s: float, keep_sample: bool) -> None:
        await self.conn.send(MountRequest(self.req_id, -1, NETWORK_CLIENT_SEQ_NUM))
        expected = self.feed_bytes + len(self.ready)
        received = 0
        tail = b""  # the last bytes, where READY must end up
        while received < expected:
            chunk = await self.conn.reader.read(READ_CHUNK_BYTES)
            assert chunk, f"{self.req_id}: the server closed the connection"
            received += len(chunk)
            data = tail + chunk
            cut = len(data) - len(self.ready)
            if cut > 0:
                self.crc = zlib.crc32(data[:cut], self.crc)
                if keep_sample:
                    self.sample += data[:cut]
                data = data[cut:]
            tail = data
        self.mounted_after_s = time.perf_counter() - started_s
        assert received == expected and tail == self.ready, f"{self.req_id}: no READY after the backlog"


def test_200_clients_mounting_at_once_all_get_the_backlog_and_ready_in_time(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as cluster:

        async def go() -> None:
            config = waltz_client_config(cluster, max_concurrent_transactions=BACKLOG_IN_FLIGHT)
            async with WaltzClient(MockCallbacks(), config) as writer:
                await asyncio.wait_for(_backlog(writer), SETUP_TIMEOUT_S)
            _connect_all.port = cluster.servers[0].port  # type: ignore[attr-defined]
            conns = await asyncio.wait_for(_connect_all(), SETUP_TIMEOUT_S)
            try:
                mounts = [_Mount(conn, FIRST_CLIENT_ID + i) for i, conn in enumerate(conns)]
                server_pid = cluster.servers[0].pid
                assert server_pid is not None
                server_cpu_before_s = cpu_seconds(server_pid)
                started_s = time.perf_counter()
                await asyncio.wait_for(
                    asyncio.gather(*(m.run(started_s, i == 0) for i, m in enumerate(mounts))),
                    SETUP_TIMEOUT_S,
                )
                server_cpu_s = (cpu_seconds(server_pid) or 0.0) - (server_cpu_before_s or 0.0)
            finally:
                await asyncio.gather(*(conn.close() for conn in conns))
            times = sorted(m.mounted_after_s or float("inf") for m in mounts)
            spread = f"mounts took {times[0]:.2f} .. {times[-1]:.2f} s, server CPU {server_cpu_s:.2f} s"
            # Every client mounted within a bound far above the expected second or so.
            assert times[-1] < ALL_MOUNTED_BOUND_S, spread
            # Not starved: served side by side, not one after another (then the last would wait
            # for all the others, 200 times the first).
            assert times[-1] <= STARVATION_FACTOR * times[0] + STARVATION_SLACK_S, spread
            # The storm's cost to the server: each batch encoded once and written once per client
            # (the original's frame-at-a-time fan-out spent 11-20 CPU seconds here, ~0.4 s now).
            assert server_cpu_s < SERVER_CPU_BOUND_S, spread
            # All fed the same bytes: the backlog, in order.
            assert len({m.crc for m in mounts}) == 1
            codec = conns[0].codec
            feed = [
                codec.decode_frame(f) for f in FrameDecoder(codec.magic, codec.version).feed(mounts[0].sample)
            ]
            assert all(isinstance(m, FeedData) for m in feed)
            assert [m.transaction_id for m in feed] == list(range(BACKLOG_TRANSACTIONS))  # type: ignore[union-attr]

        asyncio.run(go())
