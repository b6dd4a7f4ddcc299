"""Exponential backoff (``CM/util/BackoffTimer.java``): sleep, then double up to a cap."""

from __future__ import annotations

import asyncio


class Backoff:
    def __init__(self, initial_ms: int, max_ms: int) -> None:
        assert 0 < initial_ms <= max_ms
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.next_ms = initial_ms

    def reset(self) -> None:
        self.next_ms = self.initial_ms

    @property
    def at_max(self) -> bool:
        return self.next_ms >= self.max_ms

    async def wait(self) -> None:
        """Sleep the current interval (cancellation is how a closing owner stops it)."""
        delay_ms = self.next_ms
        self.next_ms = min(self.next_ms * 2, self.max_ms)
        await asyncio.sleep(delay_ms / 1000)
