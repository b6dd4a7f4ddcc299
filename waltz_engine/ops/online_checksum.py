"""Replicas of a committed range compared on running nodes (`waltz storage checksum --online`).

The tool reads the range from each replica's admin port with RECORD_LIST (no new admin message,
so Java 0.13.2 nodes answer too), in chunks, while writes go on, and compares the copies by their
records, never by bytes (segment headers differ between replicas: creation times). Each chunk's
checksum is a CRC-32 over every record's txid, reqId, header, data checksum and data; the first
chunk where two replicas differ is read again record by record to name the first txid that
differs. Memory is one chunk per replica; the range is cut at the committed bound read first, so
every replica that holds the range holds it as committed.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from waltz_engine.common.record import Record
from waltz_engine.storage.network_reader import (
    ClusterAccess,
    NetworkReadError,
    NetworkSlice,
    PartitionSources,
    ReplicaSource,
    discover,
    read_slice_records,
)

CHUNK_RECORDS = 10_000
MAX_CHUNK_RECORDS = 1_000_000
_HEAD = struct.Struct(">qiiiiii")  # txid, reqId (client, generation, partition, seq), header, checksum

# Records from one replica, in txid order, from ``from_txid`` to ``to_txid`` inclusive.
ReadRange = Callable[[ReplicaSource, int, int], Iterator[list[Record]]]


@dataclass
class ReplicaSummary:
    storage: str
    checksum: int | None = None  # over the compared range; None when not compared
    note: str = ""  # why not compared, or how it differs

    def to_json(self) -> dict[str, object]:
        return {"storage": self.storage, "checksum": self.checksum, "note": self.note}


@dataclass
class RangeComparison:
    partition_id: int
    from_txid: int
    to_txid: int  # inclusive; below from_txid: nothing committed in the range
    replicas: list[ReplicaSummary] = field(default_factory=list)
    first_difference: int | None = None  # the first txid where compared replicas differ

    @property
    def equal(self) -> bool:
        compared = [r for r in self.replicas if r.checksum is not None]
        return self.first_difference is None and len(compared) == len(self.replicas) and len(compared) > 0

    @property
    def consistent(self) -> bool:
        """Every replica holds the range and all are equal (or nothing was committed in it)."""
        return self.equal or self.to_txid < self.from_txid

    @property
    def verdict(self) -> str:
        if self.first_difference is not None:
            return f"differ at txid {self.first_difference}"
        if self.to_txid < self.from_txid:
            return "nothing committed in the range"
        return "equal" if self.equal else "incomplete: a replica is behind or unreachable"

    def to_json(self) -> dict[str, object]:
        return {
            "partition_id": self.partition_id,
            "from_txid": self.from_txid,
            "to_txid": self.to_txid,
            "equal": self.equal,
            "first_difference": self.first_difference,
            "replicas": [r.to_json() for r in self.replicas],
        }

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(partition, txids, replica, crc32 hex, result) per replica, for a table."""
        return [
            (
                str(self.partition_id),
                f"{self.from_txid}..{self.to_txid}",
                replica.storage,
                "" if replica.checksum is None else f"{replica.checksum:08x}",
                replica.note or self.verdict,
            )
            for replica in self.replicas
        ]


def record_crc(crc: int, record: Record) -> int:
    req_id = record.req_id
    head = _HEAD.pack(
        record.transaction_id,
        req_id.client_id,
        req_id.generation,
        req_id.partition_id,
        req_id.seq_num,
        record.header,
        record.checksum,
    )
    return zlib.crc32(record.data, zlib.crc32(head, crc))


def compare_partitions(
    access: ClusterAccess,
    partition_ids: Sequence[int] | None = None,
    from_txid: int = 0,
    to_txid: int | None = None,
    chunk_records: int = CHUNK_RECORDS,
) -> list[RangeComparison]:
    """Compare every replica of each partition (default: all) over ``from_txid..to_txid``
    (default: to the committed high-water mark read first)."""
    layout = discover(access, partition_ids)
    return [
        compare_sources(sources, from_txid, to_txid, _network_range(sources), chunk_records)
        for sources in layout.partitions.values()
    ]


def _network_range(sources: PartitionSources) -> ReadRange:
    def read(replica: ReplicaSource, first: int, last: int) -> Iterator[list[Record]]:
        part = NetworkSlice(sources.partition_id, first, last, (replica,), sources.store)
        return read_slice_records(part)

    return read


def compare_sources(
    sources: PartitionSources,
    from_txid: int,
    to_txid: int | None,
    read: ReadRange,
    chunk_records: int = CHUNK_RECORDS,
) -> RangeComparison:
    if not 1 <= chunk_records <= MAX_CHUNK_RECORDS:
        raise NetworkReadError(f"chunk size must be 1..{MAX_CHUNK_RECORDS}, not {chunk_records}")
    if from_txid < 0:
        raise NetworkReadError(f"--from must be 0 or more, not {from_txid}")
    last = sources.committed if to_txid is None else min(to_txid, sources.committed)
    # Below the retained start retention removed the records (each replica at its own segment
    # boundary): only what every replica still holds is compared.
    from_txid = max(from_txid, sources.retained_start)
    result = RangeComparison(sources.partition_id, from_txid, last)
    holders: list[ReplicaSource] = []
    for replica in sources.replicas:
        summary = ReplicaSummary(replica.storage)
        result.replicas.append(summary)
        if replica.readable_to < last:
            summary.note = f"behind: holds committed transactions to {replica.readable_to} only"
        else:
            holders.append(replica)
    if last < from_txid or not holders:
        return result
    crcs = {replica.storage: 0 for replica in holders}
    for first in range(from_txid, last + 1, chunk_records):
        end = min(first + chunk_records - 1, last)
        chunk = {replica.storage: _chunk_crc(read, replica, first, end) for replica in holders}
        if len(set(chunk.values())) > 1:
            result.first_difference = _first_difference(read, holders, first, end)
            for summary in result.replicas:
                if summary.storage in chunk:
                    summary.note = f"differs from txid {result.first_difference} on"
            return result
        for storage, value in chunk.items():
            crcs[storage] = zlib.crc32(value.to_bytes(4, "big"), crcs[storage])
    for summary in result.replicas:
        if summary.storage in crcs:
            summary.checksum = crcs[summary.storage]
    return result


def _chunk_crc(read: ReadRange, replica: ReplicaSource, first: int, last: int) -> int:
    crc = 0
    expected = first
    for batch in read(replica, first, last):
        for record in batch:
            if record.transaction_id != expected:
                raise NetworkReadError(
                    f"{replica.storage} answered transaction {record.transaction_id} where {expected} was due"
                )
            crc = record_crc(crc, record)
            expected += 1
    return crc


def _first_difference(read: ReadRange, holders: Sequence[ReplicaSource], first: int, last: int) -> int:
    """The first txid of ``first..last`` whose record is not the same on every holder (the chunk
    is read whole from each: a reader left half-read would leave its connection behind)."""
    copies = [
        [record_crc(0, r) for batch in read(replica, first, last) for r in batch] for replica in holders
    ]
    for offset, crcs in enumerate(zip(*copies, strict=False)):
        if len(set(crcs)) > 1:
            return first + offset
    if len({len(copy) for copy in copies}) > 1:
        return first + min(len(copy) for copy in copies)
    raise NetworkReadError(f"the replicas differed over {first}..{last} but not when read again: try again")
