"""A client's feeds leave at the end of the loop turn, one write for every partition the turn
committed (issue 33, 16 active partitions), over real TLS sockets with the fake store, in order
with everything else sent to the client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from server_support.engine_harness import Harness, TestClient, append, req, run, wait_until

from waltz_engine.common.loop_turns import count_turns
from waltz_engine.net.channel import WRITE_BUFFER_HIGH_BYTES
from waltz_engine.server.handler import ClientConnection
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_READY,
    FeedData,
    FeedRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
)

PARTITIONS = (0, 1, 2)
# Far more one-frame feeds than fill the write buffer's high-water mark.
MAX_FEEDS = 10 * WRITE_BUFFER_HIGH_BYTES


async def mounted(h: Harness, client_id: int, partitions: tuple[int, ...]) -> TestClient:
    client = await h.client()
    for partition_id in partitions:
        await client.send(MountRequest(req(client_id, 0, partition_id), -1, 1))
        assert await client.receive() == MountResponse(req(client_id, 0, partition_id), PARTITION_STATE_READY)
        await client.send(FeedRequest(req(client_id, 1, partition_id), -1))  # the realtime feed
    return client


async def one_commit(h: Harness) -> tuple[TestClient, ClientConnection, memoryview]:
    """A client fed partition 0 on a counted loop, its first commit fed; that commit's frame."""
    count_turns(asyncio.get_running_loop())  # as the server's process counts them
    client = await mounted(h, 1, (0,))
    (connection,) = h.handler.connections
    await client.send(append(req(1, 2), -1, b"x"))
    assert await client.receive() == FeedData(req(1, 2), 0, 0)
    frames = h.core.partitions[0].feed_frames.frames(connection.version, 0, 0)
    assert frames is not None
    return client, connection, frames


def count_writes(connection: ClientConnection) -> list[bytes]:
    """The writes the server hands the client's transport from here on, each as one bytes."""
    writes: list[bytes] = []
    writer = connection.conn.writer

    def counting(send: Callable[[object], None]) -> Callable[[object], None]:
        def count(data: object) -> None:
            writes.append(bytes(data) if not isinstance(data, list | tuple) else b"".join(data))
            send(data)

        return count

    writer.write = counting(writer.write)  # type: ignore[method-assign]
    writer.writelines = counting(writer.writelines)  # type: ignore[method-assign]
    return writes


def test_the_feeds_of_partitions_committed_in_one_loop_turn_reach_a_client_in_one_write() -> None:
    async def test(h: Harness) -> None:
        turns = count_turns(asyncio.get_running_loop())  # as the server's process counts them
        assert turns is not None
        client = await mounted(h, 1, PARTITIONS)
        (connection,) = h.handler.connections
        stores = [h.store.partition(partition_id) for partition_id in PARTITIONS]
        for store in stores:
            store.hold()
        for partition_id in PARTITIONS:
            await client.send(append(req(1, 2, partition_id), -1, b"x"))
        await wait_until(lambda: all(store.num_pending() == 1 for store in stores), "every append is held")
        writes = count_writes(connection)
        for store in stores:
            store.release()  # their commits are decided in one loop turn
        got = [await client.receive() for _ in PARTITIONS]
        assert sorted(m.req_id.partition_id for m in got) == list(PARTITIONS)
        assert all(isinstance(m, FeedData) and m.transaction_id == 0 for m in got)
        assert len(writes) == 1, [len(w) for w in writes]

    run(test, num_partitions=len(PARTITIONS), owned=PARTITIONS)


def test_what_is_sent_to_a_client_after_a_feed_in_the_same_turn_arrives_after_it() -> None:
    async def test(h: Harness) -> None:
        client, connection, frames = await one_commit(h)
        writes = count_writes(connection)
        # A feed, then an answer, from one callback: the answer does not pass the feed.
        connection.send_feed(frames, None)
        connection.send(FlushResponse(req(1, 3), 0))
        assert len(writes) == 1  # the feed was written there, before the answer
        assert await client.receive() == FeedData(req(1, 2), 0, 0)
        assert await client.receive() == FlushResponse(req(1, 3), 0)

    run(test)


def test_feeds_not_written_yet_count_against_the_clients_write_buffer() -> None:
    async def test(h: Harness) -> None:
        client, connection, frames = await one_commit(h)
        assert connection.writable()
        sent = 0
        while connection.writable() and sent < MAX_FEEDS:  # held for the end of the turn, yet counted
            connection.send_feed(frames, None)
            sent += 1
        assert not connection.writable()
        assert sent * len(frames) > WRITE_BUFFER_HIGH_BYTES
        assert connection.write_buffer_size_bytes() == 0
        await asyncio.sleep(0)  # the turn ends: they leave, in one write
        for _ in range(sent):
            assert await client.receive() == FeedData(req(1, 2), 0, 0)

    run(test)
