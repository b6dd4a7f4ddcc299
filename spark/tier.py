"""Ranges of a partition read straight from the storage nodes' tier (issue 25): no node is
involved, only the object store (``tier.url``, the nodes' ``storage.tier.url``).

**Planning** (driver). Every replica publishes its own manifest of the segments it uploaded
(``<cluster key>/<partition>/<replica>/manifest.json``, see
:mod:`waltz_engine.storage.tier.manifest`); a node uploads only segments wholly at or below its
local low-water mark, so every record a manifest names is committed, and copies of one txid
hold the same record whichever replica uploaded them. The plan covers the wanted range with
segments of any replica's manifest (the one reaching furthest), each a :class:`TierSlice` cut
at the plan's committed bound; what no manifest covers (the recent tail) is read over the
network as before.

**Reading** (executor). A slice fetches only its part of the objects (ranged reads: the
header, its index entries and its records' bytes) into a sparse temporary copy of the segment
and parses it with :func:`spark.segments.read_slice`, which checks every record (CRC, txids,
header) as for local files. A record that fails, or an object that cannot be read, ends the
tier read there: the slice's remaining txids are read over the network (the nodes serve them
from a whole copy), a warning in the job's log says so, and no bad record is ever emitted.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from spark.segments import ON_CORRUPT_FAIL, CorruptRecordError, SegmentSlice, read_slice
from waltz_engine.common.errors import StorageError
from waltz_engine.common.object_store import ObjectStore, ObjectStoreError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import INDEX_ENTRY_SIZE_BYTES
from waltz_engine.storage.network_reader import NetworkSlice, PartitionSources
from waltz_engine.storage.tier.manifest import TierManifest, TierSegment, object_names, replica_prefix

log = logging.getLogger(__name__)

FEATURE = "the waltz source's tier.url"
# The transaction id column of spark.schema.ARROW_SCHEMA.
TXID_COLUMN = 1


@dataclass(frozen=True)
class TierSlice:
    """Txids ``from_txid..to_txid`` of one replica's tier copy of a segment."""

    partition_id: int
    url: str
    prefix: str  # the replica's prefix in the store
    segment: TierSegment
    from_txid: int
    to_txid: int  # inclusive, at most the segment's last
    network: NetworkSlice  # the same txids over the network, where a failed tier read goes on

    @property
    def count(self) -> int:
        return max(0, self.to_txid - self.from_txid + 1)


@dataclass
class SourceCounts:
    """Where a reader's rows came from: the tier, and how many tier slices fell back."""

    tier_rows: int = 0
    fallbacks: int = 0


# A slice's remaining txids read over the network (spark.network gives the decoder).
ReadNetwork = Callable[[NetworkSlice], Iterator[pa.RecordBatch]]


def tier_copies(url: str, key: uuid.UUID, partition_id: int) -> list[tuple[str, TierSegment]]:
    """(replica prefix, segment) of every replica's manifest of the partition; a manifest that
    cannot be read is left out (its replica's segments are then read from the others)."""
    store = ObjectStore(url, FEATURE)
    copies: list[tuple[str, TierSegment]] = []
    for replica in store.list_names(replica_prefix(key, partition_id, "").rstrip("/"), files_only=False):
        prefix = replica_prefix(key, partition_id, replica)
        try:
            manifest = TierManifest.load(store, prefix)
        except StorageError as e:
            log.warning("tier: %s; not read from", e)
            continue
        copies.extend((prefix, segment) for segment in manifest.segments.values())
    return copies


def cover(
    copies: list[tuple[str, TierSegment]], start: int, end: int
) -> list[tuple[int, int, tuple[str, TierSegment] | None]]:
    """``start..end`` in consecutive pieces, each held by a copy (the one reaching furthest,
    then the first prefix) or by none (None: read over the network)."""
    ordered = sorted(copies, key=lambda c: (c[1].first_transaction_id, c[0]))
    pieces: list[tuple[int, int, tuple[str, TierSegment] | None]] = []
    active: list[tuple[str, TierSegment]] = []
    position, txid = 0, start
    while txid <= end:
        while position < len(ordered) and ordered[position][1].first_transaction_id <= txid:
            active.append(ordered[position])
            position += 1
        active = [c for c in active if c[1].max_transaction_id >= txid]
        if active:
            chosen = min(active, key=lambda c: (-c[1].max_transaction_id, c[0]))
            stop = min(chosen[1].max_transaction_id, end)
            pieces.append((txid, stop, chosen))
        else:
            following = ordered[position][1].first_transaction_id if position < len(ordered) else end + 1
            stop = min(following - 1, end)
            pieces.append((txid, stop, None))
        txid = stop + 1
    return pieces


def tier_slices(url: str, sources: PartitionSources, start: int, end: int) -> list[TierSlice | NetworkSlice]:
    """``start..end`` (at most the committed bound) from the tier where it holds them, the rest
    as :meth:`PartitionSources.slices` reads them."""
    result: list[TierSlice | NetworkSlice] = []
    if start > end:
        return result
    copies = tier_copies(url, sources.store.key, sources.partition_id)
    for low, high, copy in cover(copies, start, min(end, sources.committed)):
        if copy is None:
            result.extend(sources.slices(low, high))
        else:
            prefix, segment = copy
            network = sources.fallback_slice(low, high)
            result.append(TierSlice(sources.partition_id, url, prefix, segment, low, high, network))
    return result


def read_tier_slice(
    part: TierSlice, read_network: ReadNetwork, counts: SourceCounts | None = None
) -> Iterator[pa.RecordBatch]:
    """The slice's records in txid order: from the tier, then over the network from the first
    txid the tier could not give whole."""
    if part.count == 0:
        return
    resume = part.from_txid
    try:
        with tempfile.TemporaryDirectory(prefix="waltz-tier-") as directory:
            for batch in read_slice(_fetch(part, Path(directory)), ON_CORRUPT_FAIL):
                resume = int(batch.column(TXID_COLUMN)[-1].as_py()) + 1
                if counts is not None:
                    counts.tier_rows += batch.num_rows
                yield batch
    except (CorruptRecordError, ObjectStoreError, OSError) as e:
        log.warning(
            "tier: partition %d transactions %d..%d are read over the network: %s",
            part.partition_id,
            resume,
            part.to_txid,
            e,
        )
        if counts is not None:
            counts.fallbacks += 1
    if resume <= part.to_txid:
        yield from read_network(replace(part.network, from_txid=resume, to_txid=part.to_txid))


def _fetch(part: TierSlice, directory: Path) -> SegmentSlice:
    """The slice's part of the segment's objects, at their offsets in sparse local files (the
    rest reads as zeros, which no record check accepts), as a slice of them."""
    store = ObjectStore(part.url, FEATURE)
    first = part.segment.first_transaction_id
    data_name, index_name = object_names(part.prefix, first)
    data_path, index_path = directory / "segment.seg", directory / "segment.idx"
    # The entries of from..to, and the one after (where their bytes end) when the segment has it.
    entries_from = HEADER_SIZE_BYTES + (part.from_txid - first) * INDEX_ENTRY_SIZE_BYTES
    entries_to = min(
        HEADER_SIZE_BYTES + (part.to_txid - first + 2) * INDEX_ENTRY_SIZE_BYTES, part.segment.idx.size
    )
    with index_path.open("w+b") as index:
        _copy(store, index_name, index, 0, HEADER_SIZE_BYTES)
        _copy(store, index_name, index, entries_from, entries_to - entries_from)
        index.seek(entries_from)
        raw = index.read()
        offsets = np.frombuffer(raw[: len(raw) - len(raw) % INDEX_ENTRY_SIZE_BYTES], dtype=">i8")
    size = part.segment.seg.size
    data_from = min(max(int(offsets[0]) if len(offsets) else size, HEADER_SIZE_BYTES), size)
    count = part.to_txid - part.from_txid + 1
    data_to = min(max(int(offsets[count]) if len(offsets) > count else size, data_from), size)
    with data_path.open("wb") as data:
        _copy(store, data_name, data, 0, HEADER_SIZE_BYTES)
        _copy(store, data_name, data, data_from, data_to - data_from)
    return SegmentSlice(part.partition_id, str(data_path), first, part.from_txid, part.to_txid)


def _copy(store: ObjectStore, name: str, out: BinaryIO, offset: int, size: int) -> None:
    out.seek(offset)
    store.copy_range(name, offset, size, out)
