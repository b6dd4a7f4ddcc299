"""The nodes' HTTP endpoints (the original's Jetty servlets): /ping, /buildinfo, /health,
/metrics and /metrics/prometheus.

A deliberately small HTTP/1.1 server on asyncio: GET only, one request per connection,
bounded request size, so a stray client can neither hold memory nor a node's event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Callable
from typing import Any

from waltz_engine import __version__
from waltz_engine.common.json_text import dumps_indented
from waltz_engine.common.metrics import MetricsRegistry

log = logging.getLogger(__name__)

MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_READ_TIMEOUT_S = 5.0
NO_CACHE = "must-revalidate,no-cache,no-store"

# A health check answers (healthy, details); details are shown as the check's message.
HealthCheck = Callable[[], tuple[bool, dict[str, Any]]]


class HttpEndpoints:
    def __init__(self, service_name: str, metrics: MetricsRegistry) -> None:
        self.service_name = service_name
        self.metrics = metrics
        self.health_checks: dict[str, HealthCheck] = {}
        self._server: asyncio.Server | None = None

    def add_health_check(self, name: str, check: HealthCheck) -> None:
        self.health_checks[name] = check

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_REQUEST_HEAD_BYTES)

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def health(self) -> tuple[int, dict[str, Any]]:
        """Status code and body of /health: 200 all healthy, 500 any unhealthy, 501 none."""
        if not self.health_checks:
            return 501, {}
        now = datetime.datetime.now(datetime.UTC).isoformat()
        body: dict[str, Any] = {}
        healthy_all = True
        for name, check in sorted(self.health_checks.items()):
            try:
                healthy, details = check()
            except Exception as e:  # a failing check is an unhealthy one, not a crash
                healthy, details = False, {"error": str(e)}
            healthy_all &= healthy
            body[name] = {"healthy": healthy, "message": json.dumps(details), "timestamp": now}
        return (200 if healthy_all else 500), body

    def respond(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``path``."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/ping":
            return 200, "text/plain", b"pong\n"
        if path == "/buildinfo":
            info = {"version": __version__, "service_name": self.service_name}
            return 200, "application/json", json.dumps(info).encode()
        if path == "/metrics":
            return 200, "application/json", dumps_indented(self.metrics.to_json(), 2).encode()
        if path == "/metrics/prometheus":
            return 200, "text/plain; version=0.0.4", self.metrics.to_prometheus().encode()
        if path == "/health":
            status, body = self.health()
            return status, "application/json", json.dumps(body, indent=2).encode()
        return 404, "text/plain", b"not found: try /ping /buildinfo /health /metrics /metrics/prometheus\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                status, ctype, body = 400, "text/plain", b"bad request\n"
            elif parts[0] not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"only GET is served\n"
            else:
                status, ctype, body = self.respond(parts[1])
                if parts[0] == "HEAD":
                    body = b""
            reason = {
                200: "OK",
                400: "Bad Request",
                404: "Not Found",
                405: "Method Not Allowed",
                500: "Internal Server Error",
                501: "Not Implemented",
            }[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Cache-Control: {NO_CACHE}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError) as e:
            log.debug("http: dropped a connection: %s", e)
        finally:
            writer.close()
