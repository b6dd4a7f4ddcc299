"""What `waltz retention show` reports: per partition the retention bound, the export
watermarks, the effective bound and — where the storage admin ports are known from ZooKeeper —
each replica's first retained txid (its ``first-transaction-id`` metric).

Separate from :mod:`waltz_engine.zk.retention` because it talks to storage nodes, and the storage
engine itself imports that module.
"""

from __future__ import annotations

import ssl
from typing import Any, NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.errors import WaltzError
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StoreLayout
from waltz_engine.storage.node.partition_worker import SEGMENT_SPANS_GAUGE, metric_group
from waltz_engine.zk.export_watermarks import read_export_watermarks
from waltz_engine.zk.retention import (
    PartitionRetention,
    partition_retentions,
    read_retention_bounds,
    removable_head_segments,
)

FIRST_TRANSACTION_ID_GAUGE = "first-transaction-id"
LOCAL_LOW_WATER_MARK_GAUGE = "local-low-water-mark"


class ReplicaStart(NamedTuple):
    storage: str  # data connect string
    first_transaction_id: int | None  # None: the node did not answer (see error)
    error: str | None


class RetentionReport(NamedTuple):
    partitions: list[PartitionRetention]
    replicas: dict[int, list[ReplicaStart]]  # partition id → its replicas
    # partition id → the highest bound ever set (records below it may be gone, whatever the
    # bound is now); absent for a partition never bounded (or bounded before it was recorded)
    highest: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": [
                {
                    "partition": r.partition_id,
                    "bound": r.bound,
                    "highest_bound": self.highest.get(r.partition_id),
                    "export_watermarks": r.watermarks,
                    "effective_bound": r.effective_bound,
                    "replicas": [s._asdict() for s in self.replicas.get(r.partition_id, [])],
                }
                for r in self.partitions
            ]
        }


def read_retentions(client: KazooClient, root: str, layout: StoreLayout) -> list[PartitionRetention]:
    return partition_retentions(
        layout.num_partitions, read_retention_bounds(client, root), read_export_watermarks(client, root)
    )


class ReplicaRemovals(NamedTuple):
    """What one replica's cleaner would remove under a bound, as its node reports it now."""

    storage: str  # data connect string
    going: list[tuple[int, int]] | None  # (first, last) txids; None: unknown (see why)
    why: str | None  # a Java node lists no segment spans, or the node did not answer
    more: bool = False  # every segment the node listed may go, and it has more than it listed


async def replica_removals(
    layout: StoreLayout, ssl_context: ssl.SSLContext, timeout_ms: int, partition_id: int, limit: int
) -> list[ReplicaRemovals]:
    """Per replica of ``partition_id`` (ZooKeeper's assignment), the local segments its cleaner
    would remove below ``limit``, read from its node's admin metrics over the network (wholly
    below ``limit`` and the replica's local low-water mark + 1, never the newest). Reads only."""
    context = layout.context(ssl_context, timeout_ms)
    result: list[ReplicaRemovals] = []
    for storage, partition_ids in sorted(layout.assignments.items()):
        if partition_id not in partition_ids:
            continue
        if storage not in layout.admin_ports:
            result.append(ReplicaRemovals(storage, None, "no admin port registered in ZooKeeper"))
            continue
        try:
            async with admin_ops.admin_client(context, layout.admin_address(storage)) as admin:
                gauges = (await admin.metrics()).get("gauges", {})
        except (WaltzError, OSError) as e:
            result.append(ReplicaRemovals(storage, None, f"not answering: {e}"))
            continue
        result.append(removals_from_gauges(storage, gauges, partition_id, limit))
    return result


def removals_from_gauges(
    storage: str, gauges: dict[str, Any], partition_id: int, limit: int
) -> ReplicaRemovals:
    """What a replica's cleaner would remove below ``limit``, from its node's metrics gauges: unknown
    when they list no segment spans (a Java 0.13.2 node has no such gauge, nor any message that
    lists segments)."""
    listed = _gauge(gauges, partition_id, SEGMENT_SPANS_GAUGE)
    local = _gauge(gauges, partition_id, LOCAL_LOW_WATER_MARK_GAUGE)
    if not isinstance(listed, dict) or not isinstance(local, int):
        return ReplicaRemovals(storage, None, "its node lists no segment spans: a Java node")
    pairs = [(int(first), int(last)) for first, last in listed["spans"]]
    # Only the oldest are listed: when more exist, every listed one is sealed (the newest segment,
    # which never goes, is not among them).
    newest = [(-1, -1)] if int(listed["segments"]) > len(pairs) else []
    going = removable_head_segments([*pairs, *newest], limit, local)
    return ReplicaRemovals(storage, pairs[:going], None, more=bool(newest) and going == len(pairs))


def _gauge(gauges: dict[str, Any], partition_id: int, name: str) -> Any:
    entry = gauges.get(f"{metric_group(partition_id)}.{name}")
    return entry.get("value") if isinstance(entry, dict) else None


async def replica_starts(
    layout: StoreLayout, ssl_context: ssl.SSLContext, timeout_ms: int
) -> dict[int, list[ReplicaStart]]:
    """Each assigned replica's retained start, from its node's admin metrics."""
    context = layout.context(ssl_context, timeout_ms)
    result: dict[int, list[ReplicaStart]] = {}
    for storage, partition_ids in sorted(layout.assignments.items()):
        if storage not in layout.admin_ports:
            continue
        gauges: dict[str, Any] = {}
        error: str | None = None
        try:
            async with admin_ops.admin_client(context, layout.admin_address(storage)) as admin:
                gauges = (await admin.metrics()).get("gauges", {})
        except (WaltzError, OSError) as e:
            error = str(e)
        for partition_id in partition_ids:
            entry = gauges.get(f"{metric_group(partition_id)}.{FIRST_TRANSACTION_ID_GAUGE}")
            value = entry.get("value") if isinstance(entry, dict) else None
            first = value if isinstance(value, int) and not isinstance(value, bool) else None
            missing = None if first is not None or error else "no first-transaction-id metric"
            result.setdefault(partition_id, []).append(ReplicaStart(storage, first, error or missing))
    return result
