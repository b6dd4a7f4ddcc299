"""Issue 21 item 1, the store layer: a failed session's undecided appends are decided by its
successor from the records its recovery kept, by reqId, never by the high-water mark alone."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from waltz_engine.common.record import RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.store.config import StoreConfig
from waltz_engine.server.store.errors import AppendOutcomeUnknownError, RetainedStartError
from waltz_engine.server.store.latency_router import LatencyWeightedRoute
from waltz_engine.server.store.queued_appends import FAILED_TRANSACTION_ID, StoreAppendRequest
from waltz_engine.server.store.store_session import StoreSession
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk.retention import BelowRetainedStartError

GENERATION = 3


class Successor:
    """A recovered session whose log holds ``logged`` from ``first`` on."""

    def __init__(self, low_water_mark: int, first: int, logged: list[ReqId], retained_start: int = 0) -> None:
        self.low_water_mark = low_water_mark
        self._first = first
        self._logged = logged
        self._retained_start = retained_start  # retention removed the records below it
        self.reads: list[tuple[int, int]] = []

    async def logged_req_ids(self, first_transaction_id: int, count: int) -> list[ReqId]:
        self.reads.append((first_transaction_id, count))
        if first_transaction_id < self._retained_start:
            raise RetainedStartError("removed by retention", self._retained_start)
        start = first_transaction_id - self._first
        return self._logged[start : start + count]


def request(seq: int) -> StoreAppendRequest:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    return StoreAppendRequest(ReqId(7, GENERATION, 0, seq), 0, b"x", 0, future)


def failed_session(
    in_flight: list[StoreAppendRequest], queued: list[StoreAppendRequest], next_txid: int
) -> StoreSession:
    session = StoreSession(0, GENERATION, 5, StoreConfig(), [], None, "/r")  # type: ignore[arg-type]
    session.close()
    session._in_flight = in_flight
    session._queue = deque(queued)
    session._num_pending = len(in_flight) + len(queued)
    session._next_transaction_id = next_txid
    return session


def test_only_the_records_that_hold_the_very_request_commit_it() -> None:
    async def test() -> None:
        batch = [request(1), request(2), request(3)]
        queued = [request(4)]
        session = failed_session(batch, queued, next_txid=10)
        # Recovery kept our first record at 10; another owner's records fill 11 and 12.
        other = [ReqId(8, GENERATION + 1, 0, s) for s in (1, 2)]
        successor = Successor(low_water_mark=12, first=10, logged=[batch[0].req_id, *other])
        await session.resolve_by(successor)  # type: ignore[arg-type]
        assert [r.future.result() for r in batch] == [10, FAILED_TRANSACTION_ID, FAILED_TRANSACTION_ID]
        assert queued[0].future.result() == FAILED_TRANSACTION_ID  # never sent: certainly absent
        assert successor.reads == [(10, 3)]
        assert session.num_pending_appends == 0

    asyncio.run(test())


def test_a_batch_above_the_recovered_mark_is_absent_without_a_read() -> None:
    async def test() -> None:
        batch = [request(1), request(2)]
        session = failed_session(batch, [], next_txid=10)
        successor = Successor(low_water_mark=9, first=10, logged=[])
        await session.resolve_by(successor)  # type: ignore[arg-type]
        assert [r.future.result() for r in batch] == [FAILED_TRANSACTION_ID] * 2
        assert successor.reads == []

    asyncio.run(test())


def test_appends_whose_records_retention_removed_are_unknown_and_the_rest_decided() -> None:
    """Issue 32 (the simulator's bank seeds 218, 498, 906): the read below the retained start
    was retried with every new session, and the partition never opened again."""

    async def test() -> None:
        batch = [request(1), request(2), request(3), request(4)]
        session = failed_session(batch, [], next_txid=10)
        successor = Successor(
            low_water_mark=20,
            first=12,
            logged=[batch[2].req_id, ReqId(8, GENERATION + 1, 0, 1)],
            retained_start=12,
        )
        await session.resolve_by(successor)  # type: ignore[arg-type]
        for i in (0, 1):
            error = batch[i].future.exception()
            assert isinstance(error, AppendOutcomeUnknownError), error
            assert error.transaction_id == 10 + i
        assert [r.future.result() for r in batch[2:]] == [12, FAILED_TRANSACTION_ID]
        assert successor.reads == [(10, 4), (12, 2)]
        assert session.num_pending_appends == 0

    asyncio.run(test())


class Replica(LatencyWeightedRoute):
    """A recovered replica session whose log begins at ``start`` (retention removed the rest)."""

    def __init__(self, name: str, start: int) -> None:
        super().__init__()
        self.replica_id = name
        self.next_transaction_id = 100
        self.recovered = asyncio.Event()
        self.recovered.set()
        self.connection = self
        self._start = start
        self.asked = 0

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        raise AssertionError(f"{self.replica_id} closed: a refusal by retention is an answer")

    async def record_headers(self, transaction_id: int, count: int) -> list[RecordHeader]:
        self.asked += 1
        if transaction_id < self._start:
            raise StorageRpcError(str(BelowRetainedStartError(0, transaction_id, self._start)))
        return [
            RecordHeader(t, ReqId(7, GENERATION, 0, t), 0)
            for t in range(transaction_id, transaction_id + count)
        ]


def reading_session(replicas: list[Replica]) -> StoreSession:
    session = StoreSession(0, GENERATION, 5, StoreConfig(), replicas, None, "/r")  # type: ignore[arg-type]
    session._next_transaction_id = 100
    return session


def test_a_read_refused_by_retention_on_one_replica_is_read_from_another() -> None:
    """A replica emptied and begun late at its retained start refuses what the others still
    hold: before, its refusal was the answer, and the read of a slot every other replica held
    failed (a successor deciding a batch there failed every session the same way)."""

    async def test() -> None:
        late, holder = Replica("late", start=31), Replica("holder", start=0)
        headers = await reading_session([late, holder]).record_headers(30, 2)
        assert [h.transaction_id for h in headers] == [30, 31]
        assert late.asked >= 1 and holder.asked == 1
        # Removed on every replica: the refusal is the answer.
        everywhere = [Replica("a", start=31), Replica("b", start=31)]
        with pytest.raises(RetainedStartError) as refused:
            await reading_session(everywhere).record_headers(30, 2)
        assert refused.value.retained_start == 31

    asyncio.run(test())
