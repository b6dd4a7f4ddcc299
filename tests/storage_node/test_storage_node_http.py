"""The HTTP endpoints of a storage node carry the original's metric names (reference §1.8)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from storage_node_support import make_records, start_storage_node

HTTP_TIMEOUT_S = 10.0
NODE_GAUGES = ["waltz-storage-num-partitions", "waltz-storage-partition-ids", "waltz-version-id"]
PARTITION_GAUGES = [
    "session-id",
    "process-queue-size",
    "low-water-mark",
    "local-low-water-mark",
    "flags",
    "sequence-number",
    "max-transaction-id",
]
PARTITION_COUNTERS = [
    "last-session-info-request",
    "set-low-water-mark-request",
    "truncate-request",
    "record-header-request",
    "record-request",
    "max-transaction-request",
    "record-header-list-request",
    "record-list-request",
]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_endpoints_and_metric_names(zookeeper: str, tmp_path: Path) -> None:
    node = start_storage_node(zookeeper, tmp_path, 3, assign=[0, 2])
    try:
        assert node.jetty_port is not None
        port = node.jetty_port

        async def traffic() -> None:
            client = node.data_client()
            await client.open()
            await client.set_low_water_mark(4, 2, -1)
            await client.append(4, 2, make_records(0, 3, 2))
            await client.record(4, 2, 1)
            await client.close()

        node.run(traffic())
        assert _get(port, "/ping") == (200, "pong\n")
        status, body = _get(port, "/buildinfo")
        assert status == 200 and json.loads(body)["service_name"] == "waltz-storage"
        status, body = _get(port, "/health")
        assert status == 200
        check = json.loads(body)["storage-health-check"]
        assert check["healthy"] is True and json.loads(check["message"]) == {"storage": "true"}

        status, body = _get(port, "/metrics")
        assert status == 200
        metrics = json.loads(body)
        gauges, counters = metrics["gauges"], metrics["counters"]
        for name in NODE_GAUGES:
            assert f"waltz-storage.{name}" in gauges
        assert gauges["waltz-storage.waltz-storage-partition-ids"]["value"] == [0, 2]
        for p in (0, 2):
            group = f"waltz-storage.partition-{p}"
            for name in PARTITION_GAUGES:
                assert f"{group}.{name}" in gauges, name
            for name in PARTITION_COUNTERS:
                assert f"{group}.{name}" in counters, name
            assert f"{group}.append" in metrics["meters"]
            assert f"{group}.append-latency" in metrics["timers"]
        assert not any(k.startswith("waltz-storage.partition-1.") for k in gauges)
        assert gauges["waltz-storage.partition-2.session-id"]["value"] == 4
        assert gauges["waltz-storage.partition-2.max-transaction-id"]["value"] == 2
        assert gauges["waltz-storage.partition-2.flags"]["value"] == 5  # AVAILABLE | ASSIGNED
        assert counters["waltz-storage.partition-2.record-request"]["count"] == 1
        assert metrics["timers"]["waltz-storage.partition-2.append-latency"]["count"] == 1

        status, text = _get(port, "/metrics/prometheus")
        assert status == 200 and "waltz_storage_partition_2_max_transaction_id 2" in text

        admin_metrics = node.run(node.with_admin(lambda a: a.metrics()))
        assert set(admin_metrics["gauges"]) == set(gauges)
        assert node.terminate() == 0
    finally:
        node.close()
