"""Exponential backoff (the original's ``CM/util/BackoffTimer.java``): wait, then multiply the
interval up to a cap; with ``jitter``, each delay is drawn around the interval so that many
clients do not retry in step. The jitter is drawn from the running loop's generator where it has
one (the simulator's, seeded: a simulated run stays a function of its seed), else ``random``'s."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable


def loop_random() -> float:
    """A number in [0, 1) from the running loop's ``rng`` if it has one, else from ``random``."""
    try:
        rng = getattr(asyncio.get_running_loop(), "rng", random)
    except RuntimeError:
        rng = random
    value: float = rng.random()
    return value


class Backoff:
    def __init__(
        self,
        initial_ms: float,
        max_ms: float,
        multiplier: float = 2.0,
        jitter: float = 0.0,
        rand: Callable[[], float] = loop_random,
    ) -> None:
        assert 0 <= initial_ms <= max_ms and multiplier >= 1 and 0 <= jitter < 1
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.multiplier = multiplier
        self.jitter = jitter  # each delay is drawn from [1 - jitter, 1 + jitter] x the interval
        self._rand = rand
        self._interval_ms = initial_ms
        self.attempts = 0  # delays handed out since the last reset

    def reset(self) -> None:
        self._interval_ms = self.initial_ms
        self.attempts = 0

    @property
    def at_max(self) -> bool:
        return self._interval_ms >= self.max_ms

    def next_delay_ms(self) -> float:
        """The next delay (jittered, at most ``max_ms``); the interval grows for the one after."""
        interval = self._interval_ms
        self._interval_ms = min(interval * self.multiplier, self.max_ms)
        self.attempts += 1
        if not self.jitter:
            return interval
        spread = 1 - self.jitter + 2 * self.jitter * self._rand()
        return min(interval * spread, self.max_ms)

    async def wait(self) -> None:
        """Sleep the next delay (cancellation is how a closing owner stops it)."""
        await asyncio.sleep(self.next_delay_ms() / 1000)
