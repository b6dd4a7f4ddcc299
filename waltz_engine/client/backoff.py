"""How long a client waits before connecting again: exponential, jittered, capped.

The original reconnects at once after a dropped connection and every second after a failed
connect; a server that drops the client on every attempt (an ``apply_transaction`` that keeps
raising, a certificate the server refuses) then costs thousands of connections a minute. Here
every reconnect of one endpoint shares one backoff, reset only once a connection has proved
useful (a mount answered READY, an RPC answered).

The store's retries use the same :class:`~waltz_engine.common.backoff.Backoff` without jitter;
reconnects add the jitter that keeps many clients from reconnecting in step.
"""

from __future__ import annotations

from waltz_engine.common.backoff import Backoff

RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 10_000
RECONNECT_BACKOFF_MULTIPLIER = 2.0
RECONNECT_BACKOFF_JITTER = 0.25  # each delay is drawn from [1 - jitter, 1 + jitter] x the interval


def reconnect_backoff(
    initial_ms: float = RECONNECT_BACKOFF_INITIAL_MS, max_ms: float = RECONNECT_BACKOFF_MAX_MS
) -> Backoff:
    """The backoff one endpoint's reconnects share."""
    return Backoff(initial_ms, max_ms, RECONNECT_BACKOFF_MULTIPLIER, RECONNECT_BACKOFF_JITTER)
