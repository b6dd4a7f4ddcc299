"""Warnings a hostile or broken peer can trigger at will, logged at most once per key per
interval with the count of those held back, so a flood costs a line every few seconds."""

from __future__ import annotations

import logging

from waltz_engine.common import clock

# How often one key (a peer address, a partition) may log.
LIMITED_LOG_INTERVAL_S = 10.0
# Keys remembered at once; older ones are forgotten first when a flood brings many.
MAX_REMEMBERED_KEYS = 4096


class LimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = LIMITED_LOG_INTERVAL_S) -> None:
        assert interval_s > 0
        self._logger = logger
        self._interval_s = interval_s
        self._warned: dict[str, tuple[float, int]] = {}  # key → (last warning at, how many since)

    def warn(self, key: str, message: str) -> None:
        """Log ``message`` unless one of ``key`` was logged within the interval (then count it)."""
        now = clock.monotonic_s()
        last, since = self._warned.get(key, (None, 0))
        if last is not None and now - last < self._interval_s:
            self._warned[key] = (last, since + 1)
            return
        more = f" ({since} more like it since the last warning)" if since else ""
        self._logger.warning("%s%s", message, more)
        if len(self._warned) >= MAX_REMEMBERED_KEYS:
            self._warned = {k: e for k, e in self._warned.items() if now - e[0] < self._interval_s}
        self._warned[key] = (now, 0)
