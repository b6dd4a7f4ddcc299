"""How long a client waits before connecting again: exponential, jittered, capped.

The original reconnects at once after a dropped connection and every second after a failed
connect; a server that drops the client on every attempt (an ``apply_transaction`` that keeps
raising, a certificate the server refuses) then costs thousands of connections a minute. Here
every reconnect of one endpoint shares one backoff, reset only once a connection has proved
useful (a mount answered READY, an RPC answered).

The server's store has a plain doubling ``Backoff`` (``waltz_engine.server.store.backoff``);
this one adds the jitter that keeps many clients from reconnecting in step.
"""

from __future__ import annotations

import random
from collections.abc import Callable

RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 10_000
RECONNECT_BACKOFF_MULTIPLIER = 2.0
RECONNECT_BACKOFF_JITTER = 0.25  # each delay is drawn from [1 - jitter, 1 + jitter] x the interval


class ReconnectBackoff:
    def __init__(
        self,
        initial_ms: float = RECONNECT_BACKOFF_INITIAL_MS,
        max_ms: float = RECONNECT_BACKOFF_MAX_MS,
        multiplier: float = RECONNECT_BACKOFF_MULTIPLIER,
        jitter: float = RECONNECT_BACKOFF_JITTER,
        rand: Callable[[], float] = random.random,
    ) -> None:
        assert 0 <= initial_ms <= max_ms and multiplier >= 1 and 0 <= jitter < 1
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.multiplier = multiplier
        self.jitter = jitter
        self._rand = rand
        self._interval_ms = initial_ms
        self.attempts = 0  # delays handed out since the last reset

    def reset(self) -> None:
        self._interval_ms = self.initial_ms
        self.attempts = 0

    def next_delay_ms(self) -> float:
        """The next delay (jittered, at most ``max_ms``); the interval grows for the one after."""
        interval = self._interval_ms
        self._interval_ms = min(interval * self.multiplier, self.max_ms)
        self.attempts += 1
        spread = 1 - self.jitter + 2 * self.jitter * self._rand()
        return min(interval * spread, self.max_ms)
