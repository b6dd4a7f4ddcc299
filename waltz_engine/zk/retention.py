"""Log retention (our extension; the original Waltz never deletes): bounds in ZooKeeper, the
cleaner's decision, and the error a read below the retained start gets.

Marking and cleaning are separate, as in a WAL that marks logs deleted and lets a background
cleaner remove them later: an operator (or an export job) *marks* what may go by writing bounds
to ZooKeeper; each storage node's cleaner removes whole head segments entirely below the
effective bound, on its own schedule.

ZooKeeper layout (Java nodes ignore znodes they do not know):

* ``<root>/retention/partition/<p>``: ``int8 version=1, int64 beforeTxid`` — records below
  ``beforeTxid`` may be removed;
* ``<root>/retention/highest/<p>``: the same payload, the highest bound ever set for the
  partition (raised before the bound itself is written, never lowered, kept by a clear): records
  below it may be gone from every replica, whatever the bound is now, so an empty replica may
  begin its log up to it (``PartitionWorker._start_late``). A bound lowered after cleaners acted
  on a higher one would otherwise strand every replica added later;
* ``<root>/exports/<export-id>``: per partition the highest txid the export has durably
  taken; nothing above it may go (codec: :mod:`waltz_engine.zk.export_watermarks`).

The effective bound of a partition is ``min(retention bound, min over exports of watermark+1)``
when an export covers the partition, else the retention bound; no retention bound, no removal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz_engine.common.errors import StorageError
from waltz_engine.zk.export_watermarks import read_export_watermarks
from waltz_engine.zk.java_io import DataReader, DataWriter, JavaFormatError
from waltz_engine.zk.paths import normalize_root

RETENTION_PAYLOAD_VERSION = 1
RETENTION_ZNODE = "retention"
PARTITION_ZNODE = "partition"
HIGHEST_ZNODE = "highest"
# Compare-and-set attempts at raising the highest bound before giving up (each lost one means
# another writer raised it meanwhile: a handful covers any real contention).
MAX_HIGHEST_BOUND_ATTEMPTS = 16

# The storage FAILURE message a read below the retained start carries; servers parse the start
# back out of it (the data protocol has no field for it and must stay byte-compatible).
_RETAINED_START_TEXT = "is below the retained start"
_RETAINED_START_PATTERN = re.compile(re.escape(_RETAINED_START_TEXT) + r" (-?\d+)")


class BelowRetainedStartError(StorageError):
    """A transaction below the first one a partition still holds (retention removed it)."""

    def __init__(self, partition_id: int, transaction_id: int, retained_start: int) -> None:
        super().__init__(
            f"transaction {transaction_id} of partition {partition_id} {_RETAINED_START_TEXT} "
            f"{retained_start} (removed by retention)"
        )
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.retained_start = retained_start


def retained_start_in(message: str) -> int | None:
    """The retained start named by a :class:`BelowRetainedStartError` message, else None."""
    match = _RETAINED_START_PATTERN.search(message)
    return int(match.group(1)) if match else None


# --- payloads ----------------------------------------------------------------------------------


def encode_retention_bound(before_transaction_id: int) -> bytes:
    return DataWriter().write_int8(RETENTION_PAYLOAD_VERSION).write_int64(before_transaction_id).to_bytes()


def decode_retention_bound(data: bytes) -> int:
    reader = DataReader(data, "retention bound")
    version = reader.read_int8()
    if version != RETENTION_PAYLOAD_VERSION:
        raise JavaFormatError(f"retention bound: unsupported version {version}")
    before = reader.read_int64()
    reader.expect_end()
    return before


# --- ZooKeeper ---------------------------------------------------------------------------------


def retention_partition_path(root: str, partition_id: int) -> str:
    return f"{normalize_root(root)}/{RETENTION_ZNODE}/{PARTITION_ZNODE}/{partition_id}"


def retention_highest_path(root: str, partition_id: int) -> str:
    return f"{normalize_root(root)}/{RETENTION_ZNODE}/{HIGHEST_ZNODE}/{partition_id}"


def set_retention_bound(client: KazooClient, root: str, partition_id: int, before_transaction_id: int) -> int:
    """Set the bound; returns the highest bound ever set for the partition (this one or above).

    The highest is raised first: once a cleaner may act on the bound, it is on record."""
    if before_transaction_id < 0:
        raise ValueError(f"retention bound must not be negative: {before_transaction_id}")
    highest = _raise_highest_bound(client, root, partition_id, before_transaction_id)
    path = retention_partition_path(root, partition_id)
    payload = encode_retention_bound(before_transaction_id)
    if client.exists(path) is None:
        client.create(path, payload, makepath=True)
    else:
        client.set(path, payload)
    return highest


def _raise_highest_bound(client: KazooClient, root: str, partition_id: int, bound: int) -> int:
    path = retention_highest_path(root, partition_id)
    for _ in range(MAX_HIGHEST_BOUND_ATTEMPTS):
        try:
            data, stat = client.get(path)
        except NoNodeError:
            try:
                client.create(path, encode_retention_bound(bound), makepath=True)
            except NodeExistsError:
                continue  # created meanwhile: compare with it
            return bound
        highest = decode_retention_bound(data or b"")
        if highest >= bound:
            return highest
        try:
            client.set(path, encode_retention_bound(bound), version=stat.version)
        except BadVersionError:
            continue  # raised meanwhile: compare again
        return bound
    raise StorageError(
        f"could not record partition {partition_id}'s highest retention bound: {path} changed "
        f"{MAX_HIGHEST_BOUND_ATTEMPTS} times while being raised; run the command again"
    )


def clear_retention_bound(client: KazooClient, root: str, partition_id: int) -> bool:
    """Remove the bound (files already removed stay removed); False when there was none."""
    try:
        client.delete(retention_partition_path(root, partition_id))
    except NoNodeError:
        return False
    return True


def read_retention_bounds(client: KazooClient, root: str) -> dict[int, int]:
    return _read_bounds(client, f"{normalize_root(root)}/{RETENTION_ZNODE}/{PARTITION_ZNODE}")


def read_highest_bounds(client: KazooClient, root: str) -> dict[int, int]:
    """partition id → the highest retention bound ever set (for the partitions that had one)."""
    return _read_bounds(client, f"{normalize_root(root)}/{RETENTION_ZNODE}/{HIGHEST_ZNODE}")


def _read_bounds(client: KazooClient, directory: str) -> dict[int, int]:
    bounds = {}
    try:
        children = client.get_children(directory)
    except NoNodeError:
        return {}
    for child in children:
        if not child.isdigit():
            continue
        try:
            data, _ = client.get(f"{directory}/{child}")
        except NoNodeError:
            continue  # cleared meanwhile
        bounds[int(child)] = decode_retention_bound(data)
    return bounds


# --- decisions ---------------------------------------------------------------------------------


class PartitionRetention(NamedTuple):
    partition_id: int
    bound: int | None  # the operator's beforeTxid
    watermarks: dict[str, int]  # export id → highest exported txid of this partition
    effective_bound: int | None  # what may be removed below; None: nothing


def effective_bound(bound: int | None, watermarks: Sequence[int]) -> int | None:
    """Records below the result may go: never at/above the bound, never unexported ones."""
    if bound is None:
        return None
    return min([bound, *(watermark + 1 for watermark in watermarks)])


def partition_retentions(
    num_partitions: int, bounds: Mapping[int, int], exports: Mapping[str, Mapping[int, int]]
) -> list[PartitionRetention]:
    result = []
    for partition_id in range(num_partitions):
        watermarks = {e: marks[partition_id] for e, marks in exports.items() if partition_id in marks}
        bound = bounds.get(partition_id)
        result.append(
            PartitionRetention(
                partition_id, bound, watermarks, effective_bound(bound, list(watermarks.values()))
            )
        )
    return result


def read_effective_bounds(client: KazooClient, root: str, num_partitions: int) -> dict[int, int]:
    """partition id → effective bound, for the partitions that have one."""
    retentions = partition_retentions(
        num_partitions, read_retention_bounds(client, root), read_export_watermarks(client, root)
    )
    return {r.partition_id: r.effective_bound for r in retentions if r.effective_bound is not None}


class NodeBounds(NamedTuple):
    """What a storage node reads each cleaner round, partition id → txid."""

    effective: dict[int, int]  # records below may be removed now
    late_start: dict[int, int]  # an empty replica may begin its log up to here


def read_node_bounds(client: KazooClient, root: str, num_partitions: int) -> NodeBounds:
    effective = read_effective_bounds(client, root, num_partitions)
    late_start = dict(effective)
    for partition_id, highest in read_highest_bounds(client, root).items():
        # A bound set before the highest was recorded has none: the current bound stands then.
        late_start[partition_id] = max(highest, late_start.get(partition_id, highest))
    return NodeBounds(effective, late_start)


def removable_head_segments(
    segments: Sequence[tuple[int, int]], bound: int, local_low_water_mark: int
) -> int:
    """How many segments, from the oldest, a cleaner may remove.

    ``segments`` are (first, max) txids, oldest first. A segment goes only when it lies wholly
    below both the bound and the local low-water mark + 1 (records above the local low-water
    mark may not be committed yet), and never the last one (it is the writable segment, and it
    keeps the partition's next txid).
    """
    limit = min(bound, local_low_water_mark + 1)
    count = 0
    for _, max_transaction_id in segments[:-1]:
        if max_transaction_id >= limit:
            break
        count += 1
    return count
