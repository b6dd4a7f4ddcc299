"""The partition engine and client handler over real TLS sockets, with the fake store."""

from __future__ import annotations

import asyncio

from server_support.engine_harness import (
    GENERATION,
    RECEIVE_TIMEOUT_S,
    Harness,
    TestClient,
    append,
    req,
    run,
)
from server_support.fake_store import FakeStorePartition

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.server.config import EngineSettings
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_CLIENT_AHEAD,
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    AddPreferredPartitionRequest,
    AddPreferredPartitionResponse,
    CheckStorageConnectivityRequest,
    CheckStorageConnectivityResponse,
    FeedData,
    FeedRequest,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    ServerPartitionsAssignmentRequest,
    ServerPartitionsAssignmentResponse,
    ServerPartitionsHealthStatRequest,
    ServerPartitionsHealthStatResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from waltz_engine.zk.payloads import PartitionInfo


def history(n: int, client_id: int = 99) -> list[Record]:
    return [Record(i, req(client_id, i + 1), i * 10, b"d%d" % i, crc32(b"d%d" % i)) for i in range(n)]


async def reopen_with_history(h: Harness, n: int) -> FakeStorePartition:
    """Closes partition 0, gives its store a history of n records, opens it again."""
    store_partition = h.store.partition(0)
    await h.core.set_partitions([])
    store_partition.preload(history(n))
    await h.core.set_partitions([PartitionInfo(0, GENERATION)])
    return store_partition


async def mounted(
    harness: Harness, client_id: int, hwm: int = -1, version: int = 4, seq: int = 1
) -> TestClient:
    client = await harness.client(version)
    await client.send(MountRequest(req(client_id, 0), hwm, seq))
    got = await client.receive_until(MountResponse)
    assert got[-1].partition_state == PARTITION_STATE_READY
    return client


async def flush(client: TestClient, client_id: int) -> int:
    await client.send(FlushRequest(req(client_id, 1000)))
    got = await client.receive_until(FlushResponse)
    assert len(got) == 1, got
    return int(got[0].transaction_id)


def test_two_writers_same_lock_same_hwm_exactly_one_commits() -> None:
    async def test(h: Harness) -> None:
        a, b = await mounted(h, 1), await mounted(h, 2)
        await asyncio.gather(
            a.send(append(req(1, 1), -1, b"a", write=(42,))), b.send(append(req(2, 1), -1, b"b", write=(42,)))
        )
        await a.send(FlushRequest(req(1, 2)))
        await b.send(FlushRequest(req(2, 2)))
        got_a, got_b = await a.receive_until(FlushResponse), await b.receive_until(FlushResponse)
        records = h.store.partitions[0].records
        assert len(records) == 1
        winner = records[0].req_id.client_id
        failures = {1: got_a[:-1], 2: got_b[:-1]}
        assert failures[winner] == []
        loser = 3 - winner
        assert failures[loser] == [LockFailure(req(loser, 1), 0)]
        assert got_a[-1].transaction_id == got_b[-1].transaction_id == 0

    run(test)


def test_lock_failure_carries_the_lock_high_water_mark() -> None:
    async def test(h: Harness) -> None:
        c = await mounted(h, 1)
        await c.send(append(req(1, 1), -1, b"x", write=(7,)))
        await c.send(append(req(1, 2), -1, b"y", write=(7,)))  # computed before txn 0 was seen
        await c.send(FlushRequest(req(1, 3)))
        got = await c.receive_until(FlushResponse)
        assert got == [LockFailure(req(1, 2), 0), FlushResponse(req(1, 3), 0)]
        assert [r.req_id for r in h.store.partitions[0].records] == [req(1, 1)]

    run(test)


def test_read_and_append_lock_semantics() -> None:
    async def test(h: Harness) -> None:
        c = await mounted(h, 1)
        await c.send(append(req(1, 1), -1, write=(5,)))  # txn 0
        assert await flush(c, 1) == 0
        # read lock: checked ...
        await c.send(append(req(1, 2), -1, read=(5,)))
        await c.send(append(req(1, 3), 0, read=(5,)))  # txn 1: up to date, passes
        await c.send(FlushRequest(req(1, 4)))
        assert await c.receive_until(FlushResponse) == [
            LockFailure(req(1, 2), 0),
            FlushResponse(req(1, 4), 1),
        ]
        # ... but not committed: a writer that saw txn 0 still passes.
        await c.send(append(req(1, 5), 0, write=(5,)))  # txn 2
        assert await flush(c, 1) == 2
        # append lock: never checked, but committed.
        await c.send(append(req(1, 6), -1, append_locks=(5,)))  # txn 3
        assert await flush(c, 1) == 3
        await c.send(append(req(1, 7), 2, write=(5,)))
        await c.send(FlushRequest(req(1, 8)))
        assert await c.receive_until(FlushResponse) == [
            LockFailure(req(1, 7), 3),
            FlushResponse(req(1, 8), 3),
        ]

    run(test)


def test_mount_ready_feeds_missing_transactions_then_ready_and_client_ahead() -> None:
    async def test(h: Harness) -> None:
        await reopen_with_history(h, 5)
        c = await h.client()
        await c.send(MountRequest(req(1, 0), 4, 1))
        assert await c.receive() == MountResponse(req(1, 0), PARTITION_STATE_READY)
        await c.send(MountRequest(req(1, 1), 1, 1))
        got = await c.receive_until(MountResponse)
        assert got == [FeedData(req(99, i + 1), i, i * 10) for i in (2, 3, 4)] + [
            MountResponse(req(1, 1), PARTITION_STATE_READY)
        ]
        await c.send(MountRequest(req(1, 2), 9, 1))
        assert await c.receive() == MountResponse(req(1, 2), PARTITION_STATE_CLIENT_AHEAD)

    run(test)


def test_v0_client_gets_boolean_mount_response_and_v4_client_the_state() -> None:
    async def test(h: Harness) -> None:
        old = await h.client(version=0)
        await old.send(MountRequest(req(1, 0), 5, 1))  # ahead: "not ready" in a boolean
        assert await old.receive() == MountResponse(req(1, 0), PARTITION_STATE_NOT_READY)
        await old.send(MountRequest(req(1, 1), -1, 1))
        assert await old.receive() == MountResponse(req(1, 1), PARTITION_STATE_READY)
        await old.send(append(req(1, 2), -1, b"v0", write=(1,)))
        assert await flush(old, 1) == 0
        new = await mounted(h, 2, version=4)
        await new.send(FeedRequest(req(2, 1), -1))
        assert await new.receive() == FeedData(req(1, 2), 0, 0)
        await new.send(MountRequest(req(2, 2), 3, 1))
        assert await new.receive_until(MountResponse) == [
            MountResponse(req(2, 2), PARTITION_STATE_CLIENT_AHEAD)
        ]

    run(test)


def test_feed_delivers_in_order_with_original_req_ids_and_suspends_after_min_fetch_size() -> None:
    async def test(h: Harness) -> None:
        reader = await mounted(h, 1)
        await reader.send(FeedRequest(req(1, 1), -1))  # fetch size max(0, minFetchSize) = 3
        writer = await mounted(h, 2)
        for seq in range(1, 6):
            await writer.send(append(req(2, seq), -1, b"w%d" % seq, header=seq))
        assert await flush(writer, 2) == 4
        got = await reader.receive_until(FeedSuspended)
        assert got == [FeedData(req(2, s), s - 1, s) for s in (1, 2, 3)] + [FeedSuspended(req(1, 1))]
        # fetch size max(4 - 2, 3) = 3: txns 3 and 4 now, 5 once it commits.
        await reader.send(FeedRequest(req(1, 2), 2))
        assert [await reader.receive(), await reader.receive()] == [
            FeedData(req(2, 4), 3, 4),
            FeedData(req(2, 5), 4, 5),
        ]
        await writer.send(append(req(2, 6), 4, b"late", header=6))
        assert await reader.receive_until(FeedSuspended) == [
            FeedData(req(2, 6), 5, 6),
            FeedSuspended(req(1, 2)),
        ]

    run(test, settings=EngineSettings(min_fetch_size=3, realtime_threshold=10))


def test_catch_up_feed_reads_storage_and_hands_over() -> None:
    async def test(h: Harness) -> None:
        store_partition = await reopen_with_history(h, 300)
        c = await h.client()
        await c.send(MountRequest(req(1, 0), -1, 1))
        got = await c.receive_until(MountResponse)
        assert got[:-1] == [FeedData(req(99, i + 1), i, i * 10) for i in range(300)]
        assert got[-1] == MountResponse(req(1, 0), PARTITION_STATE_READY)
        partition = h.core.partitions[0]
        assert store_partition.record_header_calls >= 300 // 64
        assert partition.catch_up.total_added == 1 and partition.realtime.total_added == 1

    run(test, settings=EngineSettings(min_fetch_size=3, realtime_threshold=100))


def test_flush_high_water_mark_and_transaction_data() -> None:
    async def test(h: Harness) -> None:
        c = await mounted(h, 1)
        await c.send(HighWaterMarkRequest(req(1, 1)))
        assert await c.receive() == HighWaterMarkResponse(req(1, 1), -1)
        for seq in (2, 3):
            await c.send(append(req(1, seq), -1, b"payload-%d" % seq))
        assert await flush(c, 1) == 1
        await c.send(HighWaterMarkRequest(req(1, 4)))
        assert await c.receive() == HighWaterMarkResponse(req(1, 4), 1)
        await c.send(TransactionDataRequest(req(1, 5), 1))
        assert await c.receive() == TransactionDataResponse(req(1, 5), 1, b"payload-3", crc32(b"payload-3"))
        await c.send(TransactionDataRequest(req(1, 6), 7))
        missing = await c.receive()
        assert missing.data is None and "not found" in missing.exception_message
        # Not in the cache: read from the store.
        h.core.fetcher.cache.clear()
        await c.send(TransactionDataRequest(req(1, 7), 0))
        assert await c.receive() == TransactionDataResponse(req(1, 7), 0, b"payload-2", crc32(b"payload-2"))
        # One range read (RECORD_LIST), not a RECORD request per transaction.
        assert (h.store.partitions[0].record_calls, h.store.partitions[0].record_list_calls) == (0, 1)

    run(test)


def test_partition_not_owned() -> None:
    async def test(h: Harness) -> None:
        c = await h.client()
        await c.send(MountRequest(req(1, 0, partition_id=1), -1, 1))
        assert await c.receive() == MountResponse(req(1, 0, partition_id=1), PARTITION_STATE_NOT_READY)
        await c.send(TransactionDataRequest(req(1, 1, partition_id=1), 0))
        assert await c.receive() == TransactionDataResponse(
            req(1, 1, partition_id=1), 0, exception_message="partition not ready"
        )
        # APPEND, FEED and FLUSH are dropped: the next answer is the one to the HWM request.
        await c.send(append(req(1, 2, partition_id=1), -1))
        await c.send(FeedRequest(req(1, 3, partition_id=1), -1))
        await c.send(FlushRequest(req(1, 4, partition_id=1)))
        await c.send(HighWaterMarkRequest(req(1, 5)))
        assert await c.receive() == HighWaterMarkResponse(req(1, 5), -1)
        assert 1 not in h.store.partitions

    run(test)


def test_stale_connection_of_a_client_is_ignored() -> None:
    async def test(h: Harness) -> None:
        old = await mounted(h, 1, seq=1)
        new = await mounted(h, 1, seq=2)
        await old.send(append(req(1, 10), -1, b"stale"))
        await old.send(MountRequest(req(1, 11), -1, 1))  # an older network client: no answer
        await new.send(append(req(1, 12), -1, b"fresh"))
        assert await flush(new, 1) == 0
        await old.send(HighWaterMarkRequest(req(1, 13)))
        assert await old.receive() == HighWaterMarkResponse(req(1, 13), 0)
        assert [r.data for r in h.store.partitions[0].records] == [b"fresh"]

    run(test)


def test_admin_requests() -> None:
    async def test(h: Harness) -> None:
        c = await h.client()
        dummy = req(1, 0)
        await c.send(ServerPartitionsAssignmentRequest(dummy))
        assert await c.receive() == ServerPartitionsAssignmentResponse(dummy, (0,))
        await c.send(ServerPartitionsHealthStatRequest(dummy))
        assert await c.receive() == ServerPartitionsHealthStatResponse(dummy, ((0, True),))
        h.store.partitions[0].healthy = False
        await c.send(ServerPartitionsHealthStatRequest(dummy))
        assert await c.receive() == ServerPartitionsHealthStatResponse(dummy, ((0, False),))
        await c.send(CheckStorageConnectivityRequest(dummy))
        assert await c.receive() == CheckStorageConnectivityResponse(
            dummy, (("storage-a:6000", True), ("storage-b:6000", False))
        )
        await c.send(AddPreferredPartitionRequest(dummy, (1,)))
        assert await c.receive() == AddPreferredPartitionResponse(dummy, True)
        await c.send(AddPreferredPartitionRequest(dummy, (0, 2)))  # 2 >= numPartitions
        assert await c.receive() == AddPreferredPartitionResponse(dummy, False)
        assert h.core.preferred_partitions == (1,)

    run(test)


def test_failed_store_append_is_not_fed_and_flush_reports_the_hwm() -> None:
    async def test(h: Harness) -> None:
        c = await mounted(h, 1)
        h.store.partitions[0].fail_next = 1
        await c.send(append(req(1, 1), -1, b"lost", write=(3,)))
        await c.send(append(req(1, 2), -1, b"kept", write=(3,)))
        assert await flush(c, 1) == 0
        assert [r.req_id for r in h.store.partitions[0].records] == [req(1, 2)]
        # Wrong generation: refused by the store, dropped silently.
        await c.send(append(req(1, 3, generation=0), 0, b"old generation"))
        assert await flush(c, 1) == 0

    run(test)


def test_a_partition_whose_task_dies_is_reopened_and_serves_again() -> None:
    """An unexpected error ending the append task would leave a partition that queues appends
    and never answers (a smoke run saw it); the core replaces the partition instead."""

    async def test(h: Harness) -> None:
        c = await mounted(h, 1)
        await c.send(append(req(1, 2), -1, b"before"))
        assert await flush(c, 1) == 0
        failed = h.core.partitions[0]
        h.store.partitions[0].append_error = RuntimeError("injected: not a WaltzError")
        await c.send(append(req(1, 3), 0, b"never"))  # ends the append task
        deadline = asyncio.get_running_loop().time() + RECEIVE_TIMEOUT_S
        while h.core.partitions.get(0) in (failed, None):
            assert asyncio.get_running_loop().time() < deadline, "the partition was never reopened"
            await asyncio.sleep(0.01)
        assert failed.closed and h.core.partitions[0].generation == GENERATION
        # The mounted client is told by losing its connection (it reconnects and remounts): its
        # mount and flushes ended with the old partition, and nothing else tells it.
        assert await c.receive() is None
        again = await mounted(h, 2, hwm=0)
        await again.send(append(req(2, 2), 0, b"after"))
        assert await flush(again, 2) == 1
        assert [r.data for r in h.store.partitions[0].records] == [b"before", b"after"]

    run(test)


def test_a_burst_of_data_requests_is_read_from_storage_in_ranges() -> None:
    async def test(h: Harness) -> None:
        store_partition = await reopen_with_history(h, 150)
        h.core.fetcher.cache.clear()
        c = await mounted(h, 1, hwm=149)
        wanted = [*range(150), 7, 500]  # a duplicate and a txid never committed
        encode = c.conn.codec.encode_frame
        # One write: the server takes the whole burst before answering any of it.
        c.conn.send_frames([encode(TransactionDataRequest(req(1, 10 + i), t)) for i, t in enumerate(wanted)])
        await c.conn.drain()
        answers = [await c.receive() for _ in wanted]
        assert sorted(a.req_id.seq_num for a in answers) == [10 + i for i in range(len(wanted))]
        records = store_partition.records
        for answer in answers:
            if answer.transaction_id == 500:
                assert answer.data is None and "not found" in answer.exception_message
            else:
                record = records[answer.transaction_id]
                assert (answer.data, answer.checksum) == (record.data, record.checksum)
        # Ranges of at most 64 records (RECORD_LIST), never a RECORD request per transaction.
        assert store_partition.record_calls == 0
        assert 1 <= store_partition.record_list_calls <= 3

    run(test)
