"""The partition engine where retention removed the head of the log (issue 32, the simulator's
seeds 1558, 2056, bank 214, 218, 498 and 906), over real TLS sockets with the fake store.

A feed that asks for a removed transaction can never be served; a failed session's append whose
record was removed before its successor read it back has an outcome nobody can learn. Both are
final answers: the partition goes on with everything else."""

from __future__ import annotations

from server_support.engine_harness import GENERATION, Harness, append, req, run, wait_until

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.server.store.errors import AppendOutcomeUnknownError
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_READY,
    FeedData,
    FlushRequest,
    FlushResponse,
    LockFailure,
    MountRequest,
    MountResponse,
)
from waltz_engine.zk.payloads import PartitionInfo

NUM_HISTORY = 300
RETAINED_START = 100  # retention removed 0..99
STALE_HWM = 10  # a feed from before the removal (an older mount's, in the simulator)
CURRENT_HWM = 250
LOCK = 7


def history(n: int) -> list[Record]:
    return [Record(i, req(99, i + 1), i, b"d%d" % i, crc32(b"d%d" % i)) for i in range(n)]


async def reopen_with_retained_history(h: Harness) -> None:
    store_partition = h.store.partition(0)
    await h.core.set_partitions([])
    store_partition.preload(history(NUM_HISTORY))
    store_partition.retained_start = RETAINED_START
    await h.core.set_partitions([PartitionInfo(0, GENERATION)])


def test_a_feed_below_the_retained_start_ends_and_the_others_go_on() -> None:
    async def test(h: Harness) -> None:
        await reopen_with_retained_history(h)
        partition = h.core.partitions[0]
        stale = await h.client()
        # Both feeds are served by the same worker (each lags less than the realtime
        # threshold), one context after the other: the first needs a removed transaction.
        await stale.send(MountRequest(req(1, 0), STALE_HWM, 1))
        await wait_until(lambda: partition.realtime.total_removed == 1, "the removed feed ends")
        current = await h.client()
        await current.send(MountRequest(req(2, 0), CURRENT_HWM, 1))
        got = await current.receive_until(MountResponse)
        assert got[:-1] == [FeedData(req(99, i + 1), i, i) for i in range(CURRENT_HWM + 1, NUM_HISTORY)]
        assert got[-1] == MountResponse(req(2, 0), PARTITION_STATE_READY)
        # The same partition served it: the worker's task did not die on the removed feed.
        assert h.core.partitions[0] is partition

    run(test)


def test_an_append_whose_outcome_retention_made_unknowable_counts_its_locks_and_frees_the_mounts() -> None:
    async def test(h: Harness) -> None:
        store = h.store.partition(0)
        partition = h.core.partitions[0]
        writer = await h.client()
        await writer.send(MountRequest(req(1, 0), -1, 1))
        assert await writer.receive() == MountResponse(req(1, 0), PARTITION_STATE_READY)
        store.hold()
        await writer.send(append(req(1, 1), -1, b"x", write=(LOCK,)))
        await wait_until(lambda: store.num_pending() == 1, "the append reaches the store")
        reader = await h.client()
        await reader.send(MountRequest(req(2, 0), -1, 1))
        await wait_until(lambda: partition.num_waiting_for_appends() == 1, "the mount waits behind it")
        # The successor's recovery holds 0..5 (another owner's records, say); retention removed
        # transaction 3, where this append's session had put it: it may be there, or not.
        store.preload(history(6))
        store.fail_pending(AppendOutcomeUnknownError("unknowable", 3))
        got = await reader.receive_until(MountResponse)
        assert got[-1] == MountResponse(req(2, 0), PARTITION_STATE_READY)
        # A write under the same lock, computed before transaction 3, must not pass.
        store.release()
        await writer.send(append(req(1, 2), 2, b"y", write=(LOCK,)))
        await writer.send(FlushRequest(req(1, 3)))
        got = await writer.receive_until(FlushResponse)
        assert [m for m in got if not isinstance(m, FeedData)] == [
            LockFailure(req(1, 2), 3),
            FlushResponse(req(1, 3), 5),
        ]
        assert h.core.partitions[0] is partition

    run(test)
