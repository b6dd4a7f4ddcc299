"""What `waltz retention show` reports: per partition the retention bound, the export
watermarks, the effective bound and — where the storage admin ports are known from ZooKeeper —
each replica's first retained txid (its ``first-transaction-id`` metric).

Separate from :mod:`waltz_engine.zk.retention` because it talks to storage nodes, and the storage
engine itself imports that module.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.errors import WaltzError
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StoreLayout
from waltz_engine.storage.constants import SEGMENT_NAME_DIGITS, SEGMENT_SUFFIX
from waltz_engine.storage.node.partition_worker import metric_group
from waltz_engine.zk.export_watermarks import read_export_watermarks
from waltz_engine.zk.retention import (
    PartitionRetention,
    partition_retentions,
    read_retention_bounds,
    removable_head_segments,
)

FIRST_TRANSACTION_ID_GAUGE = "first-transaction-id"


class ReplicaStart(NamedTuple):
    storage: str  # data connect string
    first_transaction_id: int | None  # None: the node did not answer (see error)
    error: str | None


class RetentionReport(NamedTuple):
    partitions: list[PartitionRetention]
    replicas: dict[int, list[ReplicaStart]]  # partition id → its replicas

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": [
                {
                    "partition": r.partition_id,
                    "bound": r.bound,
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


def segments_below(data_directory: Path, partition_id: int, limit: int) -> list[tuple[int, int]]:
    """(first, last) txids of the segments of ``partition_id`` in a storage data directory that a
    cleaner may remove below ``limit``: those wholly below it, never the newest (the writable
    one). A replica also keeps what lies above its own low-water mark, which a directory alone
    does not tell: this is what the bound allows, at most."""
    names = (data_directory / str(partition_id)).glob(f"*{SEGMENT_SUFFIX}")
    firsts = sorted(int(p.stem) for p in names if len(p.stem) == SEGMENT_NAME_DIGITS and p.stem.isdigit())
    if not firsts:
        return []
    sealed = [(first, following - 1) for first, following in zip(firsts, firsts[1:], strict=False)]
    newest = (firsts[-1], max(firsts[-1], limit))  # its end is unknown here; it never goes anyway
    return sealed[: removable_head_segments([*sealed, newest], limit, limit - 1)]
