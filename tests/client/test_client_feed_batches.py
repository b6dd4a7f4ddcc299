"""A feed batch (every FeedData of a partition that arrived in one read) is applied in order under
one lock; the first callback that raises stops the batch there, and the feed resumes from it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from waltz_engine.client.partition import ApplicationError, Partition
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import FeedData

CLIENT_ID = 7
OTHER_CLIENT_ID = 8
MAX_CONCURRENT_TRANSACTIONS = 5


def _feed(first: int, last: int) -> list[FeedData]:
    return [FeedData(ReqId(OTHER_CLIENT_ID, 1, 0, txid), txid, txid * 10) for txid in range(first, last + 1)]


def test_a_batch_is_applied_in_order_and_stops_at_the_first_failure() -> None:
    async def go() -> None:
        partition = Partition(0, CLIENT_ID, MAX_CONCURRENT_TRANSACTIONS)
        partition.activate(-1)
        applied: list[tuple[int, int]] = []
        failing = {3}

        def deliver(txid: int, header: int, req_id: ReqId) -> Awaitable[None] | None:
            if txid in failing:
                failing.discard(txid)
                raise RuntimeError("injected")
            applied.append((txid, header))
            return None

        with pytest.raises(ApplicationError) as failed:
            await partition.apply_transactions(_feed(0, 6), deliver)
        assert failed.value.transaction_id == 3 and isinstance(failed.value.__cause__, RuntimeError)
        assert applied == [(0, 0), (1, 10), (2, 20)] and partition.client_high_water_mark == 2
        assert partition.application_failures == 1
        # Re-fed from the high-water mark (duplicates before it are skipped), awaiting callbacks too.

        async def later(txid: int) -> None:
            await asyncio.sleep(0)
            applied.append((txid, -1))

        def deliver_async(txid: int, header: int, req_id: ReqId) -> Awaitable[None] | None:
            return later(txid) if txid % 2 else deliver(txid, header, req_id)

        await partition.apply_transactions(_feed(1, 6), deliver_async)
        assert [txid for txid, _ in applied] == list(range(7))
        assert partition.client_high_water_mark == 6 and partition.application_failures == 0

    asyncio.run(go())
