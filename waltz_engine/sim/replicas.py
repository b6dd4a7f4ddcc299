"""The replicas' check after a seed: do the storage nodes agree on the committed log?

A replica's records at or below its low-water mark (the high-water mark its last store session
started from: recovery had decided everything below it) are committed ones, so they must be the
records the client applied. Above it a replica may still hold a dead session's undecided
records until a store session catches it up. And every committed transaction must be on a
majority of the replicas, whole (its data the bytes the client built): it was acknowledged only
once a quorum had it on disk. A replica whose media the world damaged (bit flips) may refuse to
read what is damaged, never serve it as data; a committed transaction it does not hold whole
must be whole on a quorum of the others less one (the quorum that acknowledged it may have
included the damaged replica).

:func:`export_read` reads the committed range from a replica's admin port as an export does
(RECORD_LIST, each record's txid and checksum checked by the export's own decoder) and holds
each record's header and data against what the client built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.admin_ops.operations import FIRST_TRANSACTION_ID_GAUGE
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.network_reader import BadRecordsError, decode_records
from waltz_engine.storage.node.node import StorageNode

# Records read from a replica at once.
READ_BATCH_RECORDS = 1_000


def _replica_records(
    node: StorageNode, partition_id: int, last: int, skip_refused: bool = False
) -> tuple[list[Record], int, int]:
    """The replica's records from its first up to ``last``, its low-water mark and its first txid;
    with ``skip_refused``, a record the replica refuses to read (damage it found) is left out."""
    manager = node.manager
    if manager is None:
        return [], -1, 0
    partition = manager.partition(partition_id)
    low_water_mark = partition.last_session_info().low_water_mark
    records: list[Record] = []
    first = next_txid = partition.first_transaction_id()
    end = min(last, partition.max_transaction_id())
    while next_txid <= end:
        try:
            batch = partition.records(next_txid, min(READ_BATCH_RECORDS, end - next_txid + 1))
        except WaltzError:
            if not skip_refused:
                raise
            try:
                batch = partition.records(next_txid, 1)
            except WaltzError:
                next_txid += 1
                continue
        if not batch:
            break
        records += batch
        next_txid = batch[-1].transaction_id + 1
    return records, low_water_mark, first


def _whole(record: Record, data: bytes | None) -> bool:
    return crc32(record.data) == record.checksum and (data is None or record.data == data)


def check_replicas(
    nodes: Sequence[StorageNode],
    partition_id: int,
    committed: Sequence[tuple[int, int, ReqId]],
    payloads: Mapping[int, bytes] | None = None,
    damaged: int | None = None,
    lost: int = 0,
) -> list[str]:
    """``committed``: the client's applied (txid, header, reqId) of the partition, txids from 0;
    ``payloads``: each transaction's data by its number (the header); ``damaged``: the replica
    whose media the world damaged; ``lost``: replicas assigned beside ``nodes`` whose disks
    were lost for good (the quorum counts them; a transaction they held is on that many fewer)."""
    violations: list[str] = []
    last = len(committed) - 1
    copies: dict[int, dict[Record, int]] = {}  # txid -> each distinct record -> replicas holding it
    damaged_holds: set[int] = set()  # txids the damaged replica holds whole
    retained_from = 0  # below the highest retained start, retention may have removed a copy
    for number, node in enumerate(nodes):
        name = node.config.host
        try:
            records, low_water_mark, first = _replica_records(node, partition_id, last, number == damaged)
        except WaltzError as e:
            violations.append(f"{name}: partition {partition_id} cannot be read: {e}")
            continue
        retained_from = max(retained_from, first)
        for record in records:
            txid = record.transaction_id
            held = copies.setdefault(txid, {})
            held[record] = held.get(record, 0) + 1
            _, header, req_id = committed[txid]
            data = payloads.get(header) if payloads is not None else None
            if (record.req_id, record.header) == (req_id, header):
                if not _whole(record, data):
                    violations.append(
                        f"{name}: partition {partition_id} txid {txid} ({req_id}) is served "
                        "with data other than the client appended"
                    )
                elif number == damaged:
                    damaged_holds.add(txid)
            elif txid <= low_water_mark:
                violations.append(
                    f"{name}: partition {partition_id} txid {txid} is {record.req_id} header "
                    f"{record.header} at or below its low-water mark {low_water_mark}, but {req_id} "
                    f"header {header} committed"
                )
    quorum = (len(nodes) + lost) // 2 + 1
    for txid, (_, header, req_id) in enumerate(committed[retained_from:], retained_from):
        held = copies.get(txid, {})
        data = payloads.get(header) if payloads is not None else None
        whole = sum(
            count for record, count in held.items() if record.req_id == req_id and _whole(record, data)
        )
        needed = quorum - 1 if damaged is not None and txid not in damaged_holds else quorum
        needed = max(1, needed - lost)
        if whole < needed:
            excused = " (one replica damaged)" if damaged is not None and txid not in damaged_holds else ""
            excused += f" ({lost} lost for good)" if lost else ""
            violations.append(
                f"partition {partition_id} txid {txid} ({req_id}) is on {whole} replicas, fewer than a "
                f"quorum of {quorum}{excused}"
            )
        if len({record.data for record in held if record.req_id == req_id}) > 1:
            violations.append(f"partition {partition_id} txid {txid}: the replicas hold different data")
    return violations


async def export_read(
    admin: StorageAdminClient,
    name: str,
    partition_id: int,
    committed: Sequence[tuple[int, int, ReqId]],
    payloads: Mapping[int, bytes],
) -> list[str]:
    """The replica's records up to its low-water mark (what an export trusts it for), read as an
    export reads them; a record refused (the replica knows it damaged) is skipped, as an export
    takes it from another replica; one served must be the committed one with the client's bytes."""
    violations: list[str] = []
    low_water_mark = min(len(committed) - 1, (await admin.last_session_info(partition_id)).low_water_mark)
    # From the retained start on, as an export learns it (the node's gauge): retention removed
    # what is below it, and a refusal there is no finding; everything above must be served whole.
    gauges = (await admin.metrics())["gauges"]
    first = gauges.get(f"waltz-storage.partition-{partition_id}.{FIRST_TRANSACTION_ID_GAUGE}", {})
    start = first.get("value") if isinstance(first, dict) else None
    next_txid = start if isinstance(start, int) and not isinstance(start, bool) else 0
    single_until = -1  # after a refused batch, its range is read one record at a time
    while next_txid <= low_water_mark:
        count = min(READ_BATCH_RECORDS, low_water_mark - next_txid + 1)
        if next_txid < single_until:
            count = 1
        try:
            raw = await admin.record_list_raw(partition_id, next_txid, count)
            records, got = decode_records(raw, next_txid, partition_id)
        except (StorageRpcError, BadRecordsError):
            if count > 1:
                # Read the range one record at a time, to skip only what is refused (a batch
                # again after each record read the range over and over: most of a seed's CPU).
                single_until, count = next_txid + count, 1
                try:
                    raw = await admin.record_list_raw(partition_id, next_txid, 1)
                    records, got = decode_records(raw, next_txid, partition_id)
                except (StorageRpcError, BadRecordsError):
                    records, got = [], 1
            else:
                records, got = [], 1
        if not got:
            break  # below the replica's first retained record, or past its end
        for record in records:
            _, header, req_id = committed[record.transaction_id]
            if (record.req_id, record.header, record.data) != (req_id, header, payloads.get(header)):
                violations.append(
                    f"{name}: an export read of partition {partition_id} txid {record.transaction_id} "
                    f"returns {record.req_id} header {record.header} and {len(record.data)} bytes of "
                    f"data, but {req_id} header {header} committed with the client's bytes"
                )
        next_txid += got
    return violations
