"""Issue 21 item 1: a FLUSH or MOUNT is answered only with a high-water mark at or above every
earlier append that might still commit, and only from a store session that recovered at the
partition's current generation (the engine over real TLS sockets, with the fake store)."""

from __future__ import annotations

import asyncio

from server_support.engine_harness import (
    GENERATION,
    Harness,
    TestClient,
    append,
    req,
    run,
    wait_until,
)

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    FeedData,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
)
from waltz_engine.zk.payloads import PartitionInfo

# How long a test listens for an answer that must not come (an absence cannot be awaited).
SILENCE_S = 0.5


def records(first: int, count: int, client_id: int) -> list[Record]:
    return [
        Record(txid, req(client_id, txid + 1), 0, b"d%d" % txid, crc32(b"d%d" % txid))
        for txid in range(first, first + count)
    ]


async def mount(client: TestClient, client_id: int, hwm: int, generation: int = GENERATION) -> list[object]:
    await client.send(MountRequest(req(client_id, 0, generation=generation), hwm, 1))
    return await client.receive_until(MountResponse)


def test_a_flush_behind_an_append_whose_outcome_is_unknown_is_not_answered() -> None:
    """The barrier's mechanism: an append whose store future raised was counted as decided, so a
    flush waiting for it was answered at once, below an append that might still commit."""

    async def test(h: Harness) -> None:
        client = await h.client()
        assert (await mount(client, 1, -1))[-1].partition_state == PARTITION_STATE_READY
        store = h.store.partition(0)
        store.hold()
        partition = h.core.partition(0)
        assert partition is not None
        await client.send(append(req(1, 1), -1))
        await wait_until(lambda: store.num_pending() == 1, "the append reached the store")
        await client.send(FlushRequest(req(1, 1)))
        await wait_until(lambda: partition.num_waiting_for_appends() == 1, "the flush waits for the append")
        store.fail_pending(ConnectionError("the store gave up without deciding"))
        # The partition cannot learn the outcome: it is replaced (its clients remount where a
        # recovery decides it), and the flush is never answered from it: the client loses its
        # connection instead (it reconnects and remounts; silence left it waiting for good).
        await wait_until(lambda: h.core.partition(0) is not partition, "the partition was replaced")
        assert await client.receive(SILENCE_S) is None

    run(test)


def test_after_a_generation_raise_mounts_and_flushes_see_what_another_owner_committed() -> None:
    """The path of the smoke run: the partition went to another server and came back; this server
    saw only its own newer generation and answered from its old store session."""

    async def test(h: Harness) -> None:
        store = h.store.partition(0)
        first = await h.client()
        assert (await mount(first, 1, -1))[-1].partition_state == PARTITION_STATE_READY
        for seq in range(1, 4):
            await first.send(append(req(1, seq), -1))
        await first.send(FlushRequest(req(1, 3)))
        assert (await first.receive_until(FlushResponse))[-1].transaction_id == 2
        store.commit_elsewhere(records(3, 4, client_id=2))  # client 2's appends, on another server
        await h.core.set_partitions([PartitionInfo(0, GENERATION + 2)])
        second = await h.client()
        got = await mount(second, 2, 2, generation=GENERATION + 2)
        assert got[-1].partition_state == PARTITION_STATE_READY
        assert [m.transaction_id for m in got if isinstance(m, FeedData)] == [3, 4, 5, 6]
        await second.send(FlushRequest(req(2, 4, generation=GENERATION + 1)))
        assert (await second.receive_until(FlushResponse))[-1].transaction_id == 6
        assert store.ensure_open_calls == 2  # opened once per generation, not once per mount

    run(test)


def test_a_mount_from_a_client_that_knows_a_newer_generation_is_not_ready() -> None:
    async def test(h: Harness) -> None:
        client = await h.client()
        got = await mount(client, 3, -1, generation=GENERATION + 1)
        assert got[-1].partition_state == PARTITION_STATE_NOT_READY
        await h.core.set_partitions([PartitionInfo(0, GENERATION + 1)])
        got = await mount(client, 3, -1, generation=GENERATION + 1)
        assert got[-1].partition_state == PARTITION_STATE_READY

    run(test)


def test_a_flush_of_an_append_built_for_a_newer_generation_is_not_answered_from_an_older_one() -> None:
    """Sim seed 844: a server that had not applied the newest assignment answered a flush with its
    own older high-water mark, below what another owner had committed; the client took its
    appends for absent and ran one of them again (in the log twice)."""

    async def test(h: Harness) -> None:
        client = await h.client()
        assert (await mount(client, 4, -1))[-1].partition_state == PARTITION_STATE_READY
        newer = req(4, 7, generation=GENERATION + 1)
        await client.send(FlushRequest(newer))
        await client.send(FlushRequest(req(4, 8)))
        # Answers leave in order: the first one answers the second flush, so the first got none.
        got = await client.receive_until(FlushResponse)
        assert [m.req_id for m in got if isinstance(m, FlushResponse)] == [req(4, 8)]
        await h.core.set_partitions([PartitionInfo(0, GENERATION + 1)])
        await client.send(FlushRequest(newer))
        assert (await client.receive_until(FlushResponse))[-1].req_id == newer

    run(test)


def test_an_idle_partition_answers_a_mount_storm_without_asking_the_store() -> None:
    async def test(h: Harness) -> None:
        store = h.store.partition(0)
        clients = [await h.client() for _ in range(20)]
        answers = await asyncio.gather(*(mount(c, 100 + i, -1) for i, c in enumerate(clients)))
        assert all(a[-1].partition_state == PARTITION_STATE_READY for a in answers)
        assert store.ensure_open_calls == 1

    run(test)
