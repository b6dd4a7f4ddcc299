"""Back pressure: a slow reader or a flood of appends never grows server memory without bound."""

from __future__ import annotations

import asyncio
import socket

from server_support.engine_harness import GENERATION, Harness, append, req, run, wait_until

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.net.channel import WRITE_BUFFER_HIGH_BYTES
from waltz_engine.server.feeds import FEED_BATCH_NUM_TRANSACTIONS
from waltz_engine.server.partition import APPEND_QUEUE_SIZE
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_READY,
    FeedData,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
)
from waltz_engine.zk.payloads import PartitionInfo

SMALL_SOCKET_BUFFER_BYTES = 8192
LARGE_SOCKET_BUFFER_BYTES = 1 << 20
FEED_DATA_FRAME_BYTES = 36
NUM_HISTORY = 120_000  # far more FeedData bytes than the socket and stream buffers can hold


def test_a_client_that_does_not_read_its_feed_parks_it_with_a_bounded_buffer() -> None:
    async def test(h: Harness) -> None:
        store_partition = h.store.partition(0)
        await h.core.set_partitions([])
        store_partition.preload([Record(i, req(9, i + 1), 0, b"", crc32(b"")) for i in range(NUM_HISTORY)])
        await h.core.set_partitions([PartitionInfo(0, GENERATION)])
        client = await h.client()
        client_socket = client.conn.writer.get_extra_info("socket")
        client_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET_BUFFER_BYTES)
        await client.send(MountRequest(req(1, 0), -1, 1))
        await wait_until(lambda: len(h.handler.connections) == 1, "the server sees the connection")
        (server_side,) = h.handler.connections
        server_side.conn.writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET_BUFFER_BYTES
        )
        # The client reads nothing: the feed must end up parked, not buffered.
        await wait_until(lambda: server_side.num_parked() == 1, "the feed is parked")
        partition = h.core.partitions[0]
        assert partition.num_feed_contexts() == 0
        # Checked before each batch (one write): at most one batch beyond the high-water mark.
        max_batch_bytes = FEED_BATCH_NUM_TRANSACTIONS * FEED_DATA_FRAME_BYTES
        assert server_side.write_buffer_size_bytes() <= WRITE_BUFFER_HIGH_BYTES + max_batch_bytes
        # Now read it all: every transaction in order, then READY.
        client_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, LARGE_SOCKET_BUFFER_BYTES)
        server_side.conn.writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, LARGE_SOCKET_BUFFER_BYTES
        )
        for txid in range(NUM_HISTORY):
            message = await client.receive()
            assert isinstance(message, FeedData) and message.transaction_id == txid, message
        assert await client.receive() == MountResponse(req(1, 0), PARTITION_STATE_READY)
        assert server_side.num_parked() == 0

    run(test)


def test_appends_faster_than_the_store_fill_the_bounded_queue_then_stop_being_read() -> None:
    num_appends = 3 * APPEND_QUEUE_SIZE + 200

    async def test(h: Harness) -> None:
        store_partition = h.store.partitions[0]
        client = await h.client()
        await client.send(MountRequest(req(1, 0), -1, 1))
        assert await client.receive() == MountResponse(req(1, 0), PARTITION_STATE_READY)
        store_partition.hold()  # the storage stops acknowledging
        partition = h.core.partitions[0]
        sender = asyncio.ensure_future(
            asyncio.gather(
                *(client.send(append(req(1, s), -1, b"x" * 100)) for s in range(1, num_appends + 1))
            )
        )
        await wait_until(
            lambda: partition.append_queue_size() == APPEND_QUEUE_SIZE, "the append queue is full"
        )
        # Store bounded at 2 x batch (+1 being handed over); the rest waits in the client and the socket.
        assert store_partition.num_pending() <= 2 * 100 + 1
        assert partition.append_queue_size() == APPEND_QUEUE_SIZE
        store_partition.release()
        await sender
        await client.send(FlushRequest(req(1, num_appends + 1)))
        assert await client.receive() == FlushResponse(req(1, num_appends + 1), num_appends - 1)
        assert store_partition.max_pending_seen <= 2 * 100 + 1

    run(test)
