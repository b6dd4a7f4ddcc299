"""The nodes' HTTP endpoints over a real socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.http_endpoints import HttpEndpoints


async def _get(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _run(endpoints: HttpEndpoints, requests: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    async def go() -> list[tuple[int, dict[str, str], bytes]]:
        await endpoints.start("127.0.0.1", 0)
        try:
            return [await _get(endpoints.port, r) for r in requests]
        finally:
            await endpoints.close()

    return asyncio.run(go())


def _req(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_ping_buildinfo_metrics_and_prometheus() -> None:
    metrics = MetricsRegistry()
    metrics.gauge("waltz-storage", "waltz-storage-num-partitions", lambda: 4)
    metrics.meter("waltz-storage.partition-0", "append").mark(3)
    metrics.timer("waltz-storage.partition-0", "append-latency").update_ms(2.5)
    metrics.counter("waltz-storage.partition-0", "record-request").inc()
    ep = HttpEndpoints("waltz-storage", metrics)
    ping, build, met, prom, missing = _run(
        ep, [_req("/ping"), _req("/buildinfo"), _req("/metrics"), _req("/metrics/prometheus"), _req("/nope")]
    )
    assert ping[0] == 200 and ping[2] == b"pong\n"
    assert ping[1]["Cache-Control"] == "must-revalidate,no-cache,no-store"
    assert json.loads(build[2])["service_name"] == "waltz-storage"
    body: dict[str, Any] = json.loads(met[2])
    assert set(body) == {"version", "gauges", "counters", "histograms", "meters", "timers"}
    assert body["gauges"]["waltz-storage.waltz-storage-num-partitions"] == {"value": 4}
    assert body["meters"]["waltz-storage.partition-0.append"]["count"] == 3
    assert body["timers"]["waltz-storage.partition-0.append-latency"]["p50"] == 2.5
    text = prom[2].decode()
    assert "waltz_storage_waltz_storage_num_partitions 4" in text
    assert "waltz_storage_partition_0_append_total 3" in text
    assert 'waltz_storage_partition_0_append_latency_seconds{quantile="0.5"} 0.0025' in text
    assert missing[0] == 404


def test_health_codes() -> None:
    ep = HttpEndpoints("waltz-server", MetricsRegistry())
    state = {"ok": True}
    (none,) = _run(ep, [_req("/health")])
    assert none[0] == 501
    ep.add_health_check("server-health-check", lambda: (state["ok"], {"zookeeper": state["ok"]}))
    (good,) = _run(ep, [_req("/health")])
    state["ok"] = False
    (bad,) = _run(ep, [_req("/health")])
    assert good[0] == 200 and bad[0] == 500
    assert json.loads(json.loads(bad[2])["server-health-check"]["message"]) == {"zookeeper": False}


def test_bad_requests_do_not_break_the_server() -> None:
    ep = HttpEndpoints("x", MetricsRegistry())
    post, garbage, ping = _run(ep, [_req("/ping", "POST"), b"\x00\x01garbage\r\n\r\n", _req("/ping")])
    assert post[0] == 405 and garbage[0] == 400 and ping[0] == 200
