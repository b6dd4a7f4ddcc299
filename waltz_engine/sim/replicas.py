"""The replicas' check after a seed: do the storage nodes agree on the committed log?

A replica's records at or below its low-water mark (the high-water mark its last store session
started from: recovery had decided everything below it) are committed ones, so they must be the
records the client applied. Above it a replica may still hold a dead session's undecided
records until a store session catches it up. And every committed transaction must be on a
majority of the replicas, whole: it was acknowledged only once a quorum had it on disk.
"""

from __future__ import annotations

from collections.abc import Sequence

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage.node.node import StorageNode

# Records read from a replica at once.
READ_BATCH_RECORDS = 1_000


def _replica_records(node: StorageNode, partition_id: int, last: int) -> tuple[list[Record], int, int]:
    """The replica's records from its first up to ``last``, its low-water mark and its first txid."""
    manager = node.manager
    if manager is None:
        return [], -1, 0
    partition = manager.partition(partition_id)
    low_water_mark = partition.last_session_info().low_water_mark
    records: list[Record] = []
    first = next_txid = partition.first_transaction_id()
    end = min(last, partition.max_transaction_id())
    while next_txid <= end:
        batch = partition.records(next_txid, min(READ_BATCH_RECORDS, end - next_txid + 1))
        if not batch:
            break
        records += batch
        next_txid = batch[-1].transaction_id + 1
    return records, low_water_mark, first


def check_replicas(
    nodes: Sequence[StorageNode], partition_id: int, committed: Sequence[tuple[int, int, ReqId]]
) -> list[str]:
    """``committed``: the client's applied (txid, header, reqId) of the partition, txids from 0."""
    violations: list[str] = []
    last = len(committed) - 1
    copies: dict[int, dict[Record, int]] = {}  # txid -> each distinct record -> replicas holding it
    retained_from = 0  # below the highest retained start, retention may have removed a copy
    for number, node in enumerate(nodes):
        try:
            records, low_water_mark, first = _replica_records(node, partition_id, last)
        except WaltzError as e:
            violations.append(f"storage-{number}: partition {partition_id} cannot be read: {e}")
            continue
        retained_from = max(retained_from, first)
        for record in records:
            txid = record.transaction_id
            held = copies.setdefault(txid, {})
            held[record] = held.get(record, 0) + 1
            _, header, req_id = committed[txid]
            if txid <= low_water_mark and (record.req_id, record.header) != (req_id, header):
                violations.append(
                    f"storage-{number}: partition {partition_id} txid {txid} is {record.req_id} header "
                    f"{record.header} at or below its low-water mark {low_water_mark}, but {req_id} "
                    f"header {header} committed"
                )
    quorum = len(nodes) // 2 + 1
    for txid, (_, _, req_id) in enumerate(committed[retained_from:], retained_from):
        held = copies.get(txid, {})
        whole = max((count for record, count in held.items() if record.req_id == req_id), default=0)
        if whole < quorum:
            violations.append(
                f"partition {partition_id} txid {txid} ({req_id}) is on {whole} replicas, fewer than a "
                f"quorum of {quorum}"
            )
        data = {record.data for record in held if record.req_id == req_id}
        if len(data) > 1:
            violations.append(f"partition {partition_id} txid {txid}: the replicas hold different data")
    return violations
