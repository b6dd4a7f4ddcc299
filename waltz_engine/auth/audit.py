"""The audit log: one JSON line per refused request and per ACL change, floods aggregated.

A refusal is written at once the first time in a window (``authorizer.audit.aggregateMs``) for
its (principal, operation, resource, request); the same refusal again within the window is
counted, and when the window ends one line says how many more there were (``"count"``), so a
client retrying a refused append 1 000 times a second costs a line a second and nothing is
dropped unseen. The first line of each window also goes to the node's log (warning).
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from waltz_engine.common import clock

log = logging.getLogger(__name__)

DEFAULT_AGGREGATE_MS = 1_000
# Distinct refusals kept counting at once; past it every pending count is written out first.
MAX_AGGREGATED_KEYS = 10_000

Key = tuple[str, str, str, str]


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


class AuditLog:
    """Appends JSON lines to ``path`` (None: only the node's log); thread-safe."""

    def __init__(
        self,
        path: Path | None,
        node: str,
        aggregate_ms: int = DEFAULT_AGGREGATE_MS,
        monotonic_s: Callable[[], float] = clock.monotonic_s,
    ) -> None:
        assert aggregate_ms > 0
        self.path = path
        self.node = node
        self.aggregate_s = aggregate_ms / 1000
        self._monotonic_s = monotonic_s
        self._lock = threading.Lock()
        self._windows: dict[Key, list[Any]] = {}  # key -> [window start, repeats, peer]
        self._timer: threading.Timer | None = None
        self._file: TextIO | None = None
        self.lines_written = 0

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": _now_iso(), "node": self.node, **record}, sort_keys=False)
        self.lines_written += 1
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(line + "\n")
        self._file.flush()

    def refused(self, principal: str, operation: str, resource: str, request: str, peer: str) -> None:
        key = (principal, operation, resource, request)
        now = self._monotonic_s()
        with self._lock:
            window = self._windows.get(key)
            if window is not None and now - window[0] < self.aggregate_s:
                window[1] += 1
                window[2] = peer
                self._arm()
                return
            if window is not None:
                self._flush_window(key, window)
            if len(self._windows) >= MAX_AGGREGATED_KEYS:
                self._flush_all()
            self._windows[key] = [now, 0, peer]
            self._write(self._refusal(key, peer, 1))
        log.warning(
            "refused %s (%s) on %s to principal %s from %s", request, operation, resource, principal, peer
        )

    @staticmethod
    def _refusal(key: Key, peer: str, count: int, aggregated: bool = False) -> dict[str, Any]:
        principal, operation, resource, request = key
        record: dict[str, Any] = {
            "event": "refused",
            "principal": principal,
            "operation": operation,
            "resource": resource,
            "request": request,
            "decision": "deny",
            "peer": peer,
            "count": count,
        }
        if aggregated:
            record["aggregated"] = True
        return record

    def _flush_window(self, key: Key, window: list[Any]) -> None:
        if window[1]:
            self._write(self._refusal(key, window[2], window[1], aggregated=True))
            window[1] = 0

    def _flush_all(self) -> None:
        for key, window in self._windows.items():
            self._flush_window(key, window)
        self._windows.clear()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.aggregate_s, self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        now = self._monotonic_s()
        with self._lock:
            self._timer = None
            pending = False
            for key, window in list(self._windows.items()):
                if now - window[0] >= self.aggregate_s:
                    self._flush_window(key, window)
                    del self._windows[key]
                elif window[1]:
                    pending = True
            if pending:
                self._arm()

    def acl_changed(
        self, added: list[dict[str, str]], removed: list[dict[str, str]], version: int, initial: bool = False
    ) -> None:
        record: dict[str, Any] = {
            "event": "acl-change",
            "added": added,
            "removed": removed,
            "znode_version": version,
        }
        if initial:
            record["initial"] = True  # read at the node's start, not changed then
        with self._lock:
            self._write(record)
        log.info(
            "ACLs changed (znode version %d): %d entries added, %d removed", version, len(added), len(removed)
        )

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush_all()
            if self._file is not None:
                self._file.close()
                self._file = None
