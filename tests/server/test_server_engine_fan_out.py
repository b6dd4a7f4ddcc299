"""Many clients at once (issues 13.6, 14.1), over real TLS sockets with the fake store: a mount
waits for the appends queued before it without stopping the appends behind it, mounts waiting on
the same appends are answered together, and a feed is encoded once and written in batches."""

from __future__ import annotations

import math
from collections.abc import Callable

from server_support.engine_harness import GENERATION, Harness, TestClient, append, req, run, wait_until

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.wire.client_messages import PARTITION_STATE_READY, FeedData, MountRequest, MountResponse
from waltz_engine.zk.payloads import PartitionInfo

FEED_BLOCK = 64
NUM_STORM_CLIENTS = 20
NUM_HISTORY = 300


async def mounted(h: Harness, client_id: int) -> TestClient:
    client = await h.client()
    await client.send(MountRequest(req(client_id, 0), -1, 1))
    assert await client.receive() == MountResponse(req(client_id, 0), PARTITION_STATE_READY)
    return client


def test_mounts_wait_for_earlier_appends_while_later_appends_reach_the_store() -> None:
    async def test(h: Harness) -> None:
        store = h.store.partitions[0]
        partition = h.core.partitions[0]
        writer = await mounted(h, 1)
        store.hold()  # the storage stops acknowledging
        await writer.send(append(req(1, 1), -1, b"before the mounts"))
        await wait_until(lambda: store.num_pending() == 1, "the first append reaches the store")
        readers = [await h.client() for _ in range(NUM_STORM_CLIENTS)]
        for client_id, reader in enumerate(readers, start=2):
            await reader.send(MountRequest(req(client_id, 0), -1, 1))
        await wait_until(
            lambda: partition.num_waiting_for_appends() == NUM_STORM_CLIENTS, "every mount waits"
        )
        # The append path goes on: the original's flush-per-mount held this one back.
        await writer.send(append(req(1, 2), -1, b"after the mounts"))
        await wait_until(lambda: store.num_pending() == 2, "an append behind the mounts reaches the store")
        assert partition.num_waiting_for_appends() == NUM_STORM_CLIENTS
        store.release()
        for client_id, reader in enumerate(readers, start=2):
            got = await reader.receive_until(MountResponse)
            assert got[-1] == MountResponse(req(client_id, 0), PARTITION_STATE_READY)
            # At least the append queued before the mount, in order.
            assert [m.transaction_id for m in got[:-1]][:1] == [0]
            assert all(isinstance(m, FeedData) for m in got[:-1])
        assert partition.num_waiting_for_appends() == 0

    run(test)


def test_a_storm_of_mounts_is_fed_from_frames_encoded_once_in_one_write_per_batch() -> None:
    async def test(h: Harness) -> None:
        store = h.store.partition(0)
        await h.core.set_partitions([])
        store.preload([Record(i, req(9, i + 1), i, b"", crc32(b"")) for i in range(NUM_HISTORY)])
        await h.core.set_partitions([PartitionInfo(0, GENERATION)])
        clients = [await h.client() for _ in range(NUM_STORM_CLIENTS)]
        await wait_until(lambda: len(h.handler.connections) == NUM_STORM_CLIENTS, "all connected")
        writes: list[int] = []
        for connection in h.handler.connections:
            writes.append(0)
            writer = connection.conn.writer
            index = len(writes) - 1

            def counting(send: Callable[[object], None], index: int = index) -> Callable[[object], None]:
                def count(data: object) -> None:
                    writes[index] += 1
                    send(data)

                return count

            writer.write = counting(writer.write)  # type: ignore[method-assign]
            writer.writelines = counting(writer.writelines)  # type: ignore[method-assign]
        for client_id, client in enumerate(clients, start=1):
            await client.send(MountRequest(req(client_id, 0), -1, 1))
        for client_id, client in enumerate(clients, start=1):
            got = await client.receive_until(MountResponse)
            assert got[-1] == MountResponse(req(client_id, 0), PARTITION_STATE_READY)
            assert [m.transaction_id for m in got[:-1]] == list(range(NUM_HISTORY))
        partition = h.core.partitions[0]
        batches = math.ceil(NUM_HISTORY / FEED_BLOCK)
        # One write per batch of frames (READY rides with the last), not one per frame.
        assert writes == [batches] * NUM_STORM_CLIENTS
        # Each transaction encoded once for every client; each block read from storage once.
        assert partition.feed_frames.frames_encoded == NUM_HISTORY
        assert store.record_header_calls == batches

    run(test)
