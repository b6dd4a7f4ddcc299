"""The nodes' own counts a producer benchmark reads from their /metrics before and after a run:
each server's loop iterations, each storage node's append requests and disk batches (how many
transactions a server batch carries, how many partitions share a disk pass)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any, NamedTuple

from waltz_engine.ops.devcluster import LocalCluster

# The servers' loop iterations are read from their /metrics before and after a run.
LOOP_ITERATIONS_GAUGE = "waltz-server.loop-iterations"
# So are the storage nodes' append requests (the partitions' append meters) and their disk
# batches: how many transactions a server batch carries, and how many partitions share a pass.
STORAGE_APPEND_METER_SUFFIX = ".append"
STORAGE_PARTITION_GROUP_PREFIX = "waltz-storage.partition-"
STORAGE_PASSES_COUNTER = "waltz-storage.disk-passes"
STORAGE_PASS_BATCHES_COUNTER = "waltz-storage.disk-pass-batches"
STORAGE_THREAD_BATCHES_COUNTER = "waltz-storage.disk-connection-thread-batches"
METRICS_TIMEOUT_S = 5.0


def _metrics(http_ports: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each node's /metrics that answered."""
    found = {}
    for name, port in http_ports.items():
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as r:
                metrics = json.loads(r.read())
        except (OSError, ValueError):
            continue
        if isinstance(metrics, dict):
            found[name] = metrics
    return found


def node_counts(http_ports: dict[str, int]) -> tuple[dict[str, int], dict[str, StorageBatches]]:
    """Each server's loop iterations so far (gauge ``waltz-server.loop-iterations``), and
    each storage node's append requests and disk batches so far."""
    loops: dict[str, int] = {}
    batches: dict[str, StorageBatches] = {}
    for name, metrics in _metrics(http_ports).items():
        value = metrics.get("gauges", {}).get(LOOP_ITERATIONS_GAUGE, {}).get("value")
        if isinstance(value, int):
            loops[name] = value
        counters = metrics.get("counters", {})
        if STORAGE_PASSES_COUNTER not in counters:
            continue
        meters = metrics.get("meters", {})
        appends = sum(
            meter.get("count", 0)
            for key, meter in meters.items()
            if key.startswith(STORAGE_PARTITION_GROUP_PREFIX) and key.endswith(STORAGE_APPEND_METER_SUFFIX)
        )
        pass_batches = _count(counters, STORAGE_PASS_BATCHES_COUNTER)
        batches[name] = StorageBatches(
            appends,
            pass_batches + _count(counters, STORAGE_THREAD_BATCHES_COUNTER),
            _count(counters, STORAGE_PASSES_COUNTER),
            pass_batches,
        )
    return loops, batches


def _count(counters: dict[str, Any], key: str) -> int:
    return int(counters.get(key, {}).get("count", 0))


class StorageBatches(NamedTuple):
    """A storage node's counts over a run: append requests (each a server's batch of one
    partition), partition batches written (each one write and ``fdatasync``), disk passes and
    the partition batches they carried."""

    append_requests: int
    disk_batches: int
    passes: int
    pass_batches: int

    def since(self, before: StorageBatches) -> StorageBatches:
        return StorageBatches(*(now - then for now, then in zip(self, before, strict=True)))

    def per_transaction(self, transactions: int) -> dict[str, float]:
        return {
            "transactions_per_append_request": round(transactions / max(self.append_requests, 1), 2),
            "append_requests_per_disk_batch": round(self.append_requests / max(self.disk_batches, 1), 2),
            "partition_batches_per_disk_pass": round(self.pass_batches / max(self.passes, 1), 2),
        }


def local_http_ports(cluster: LocalCluster) -> dict[str, int]:
    """A local cluster's servers' and storage nodes' HTTP ports, whose /metrics are read."""
    return {node.name: node.jetty_port for node in cluster.nodes if node.kind in ("server", "storage")}
