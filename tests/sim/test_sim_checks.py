"""The simulator's checks themselves: each reports what it exists to catch (a checker that cannot
fail is no checker), on stand-in replicas and an application fed by hand."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from waltz_engine.client import Transaction
from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.sim.replicas import check_replicas
from waltz_engine.sim.workload import Application
from waltz_engine.storage.control_file import SessionInfo
from waltz_engine.storage.node.node import StorageNode


def _record(txid: int, header: int | None = None) -> Record:
    header = txid if header is None else header
    data = header.to_bytes(8, "big")
    return Record(txid, ReqId(1, 1, 0, header + 1), header, data, crc32(data))


class _Replica:
    """What the check reads of a storage node: its partition's records and low-water mark."""

    def __init__(self, records: list[Record], low_water_mark: int) -> None:
        self.records_held = records
        self.low_water_mark = low_water_mark
        self.manager = self
        self.config = SimpleNamespace(host="storage-?")

    def partition(self, partition_id: int) -> _Replica:
        return self

    def last_session_info(self) -> SessionInfo:
        return SessionInfo(1, self.low_water_mark, self.low_water_mark)

    def first_transaction_id(self) -> int:
        return 0

    def max_transaction_id(self) -> int:
        return len(self.records_held) - 1

    def records(self, transaction_id: int, max_records: int) -> list[Record]:
        return self.records_held[transaction_id : transaction_id + max_records]


def _check(
    *replicas: _Replica,
    committed: int = 3,
    payloads: dict[int, bytes] | None = None,
    damaged: int | None = None,
) -> list[str]:
    log = [(txid, txid, _record(txid).req_id) for txid in range(committed)]
    for number, replica in enumerate(replicas):
        replica.config = SimpleNamespace(host=f"storage-{number}")  # the node's name in findings
    return check_replicas(cast("list[StorageNode]", list(replicas)), 0, log, payloads, damaged)


def test_replicas_that_agree_pass_and_one_lagging_behind_is_no_fault() -> None:
    whole = [_record(txid) for txid in range(3)]
    assert _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(whole[:1], 0)) == []


def test_a_replica_that_differs_at_or_below_its_low_water_mark_is_reported() -> None:
    whole = [_record(txid) for txid in range(3)]
    stale = [_record(0), _record(1, header=7), _record(2)]
    violations = _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(stale, 2))
    assert violations == [
        "storage-2: partition 0 txid 1 is ReqId(c:1,g:1,p:0,s:8) header 7 at or below its low-water mark 2, "
        "but ReqId(c:1,g:1,p:0,s:2) header 1 committed"
    ]
    # Above its low-water mark a replica may hold a dead session's record: the quorum still has it.
    assert _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(stale, 0)) == []


def test_a_committed_transaction_on_fewer_than_a_quorum_is_reported() -> None:
    whole = [_record(txid) for txid in range(3)]
    violations = _check(_Replica(whole, 2), _Replica(whole[:2], 1), _Replica(whole[:2], 1))
    assert violations == [
        "partition 0 txid 2 (ReqId(c:1,g:1,p:0,s:3)) is on 1 replicas, fewer than a quorum of 2"
    ]


def test_different_data_under_one_reqid_is_reported() -> None:
    whole = [_record(txid) for txid in range(3)]
    rotten = whole[:2] + [whole[2]._replace(data=b"rotten")]
    assert _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(rotten, 1)) == [
        "storage-2: partition 0 txid 2 (ReqId(c:1,g:1,p:0,s:3)) is served with data other than the "
        "client appended",
        "partition 0 txid 2: the replicas hold different data",
    ]


def test_data_other_than_the_client_built_is_reported_even_when_every_replica_agrees() -> None:
    whole = [_record(txid) for txid in range(3)]
    built = {txid: txid.to_bytes(8, "big") for txid in range(3)}
    assert _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(whole, 2), payloads=built) == []
    built[1] = b"other bytes"
    violations = _check(_Replica(whole, 2), _Replica(whole, 2), _Replica(whole, 2), payloads=built)
    assert violations[:1] == [
        "storage-0: partition 0 txid 1 (ReqId(c:1,g:1,p:0,s:2)) is served with data other than the "
        "client appended"
    ]
    assert (
        violations[-1]
        == "partition 0 txid 1 (ReqId(c:1,g:1,p:0,s:2)) is on 0 replicas, fewer than a quorum of 2"
    )


def test_a_damaged_replica_lowers_the_quorum_only_for_what_it_does_not_hold_whole() -> None:
    whole = [_record(txid) for txid in range(3)]
    # Replica 0 was damaged (the world flipped its bits) and no longer serves txid 2; replica 2 lags.
    damaged, lagging = _Replica(whole[:2], 1), _Replica(whole[:2], 1)
    assert _check(damaged, _Replica(whole, 2), lagging, damaged=0) == []
    # Undamaged, the same replicas hold txid 2 on fewer than a quorum.
    assert _check(damaged, _Replica(whole, 2), lagging) == [
        "partition 0 txid 2 (ReqId(c:1,g:1,p:0,s:3)) is on 1 replicas, fewer than a quorum of 2"
    ]


def test_the_application_reports_a_high_water_mark_that_does_not_move_to_the_next_transaction() -> None:
    async def go() -> list[str]:
        application = Application()
        for txid in (0, 1, 1, 3):
            record = _record(txid)
            loop = asyncio.get_running_loop()
            transaction = Transaction(
                txid, record.header, record.req_id, cast(Any, None), loop, cast(Any, None)
            )
            await application.apply_transaction(transaction)
        return application.violations

    assert asyncio.run(go()) == [
        "partition 0: the client high-water mark 1 moved to 1",
        "partition 0: the client high-water mark 1 moved to 3",
    ]
