"""How long a partition's appends usually take to commit, and so when one has waited too long.

An append the server can no longer commit (its store session was fenced, say by ``waltz
recover``) is decided "absent" by the next session within milliseconds, but the client learns
it only by asking: a FlushRequest (the original's wire, no new message). The original asks
after a fixed ``client.longWaitThreshold`` (5 s, checked every 5 s). Here the partition asks
once an append has waited ``LONG_WAIT_LATENCY_MULTIPLE`` times the moving average of its recent
commits, within ``[LONG_WAIT_FLOOR_MS, client.longWaitThreshold]``; a flush for a healthy append
costs one small frame and changes nothing (the feed still decides it).
"""

from __future__ import annotations

# A flush is sent once the oldest pending append waited this many times the usual commit latency.
LONG_WAIT_LATENCY_MULTIPLE = 8
# Never sooner: a busy server's commits jitter by tens of milliseconds.
LONG_WAIT_FLOOR_MS = 250
# The estimate before the first commit: a cold client (`waltz append`) asks after 400 ms, when a
# healthy first commit has usually arrived; asking too early costs one frame, nothing else.
INITIAL_COMMIT_LATENCY_MS = 50.0
# Weight of the newest sample in the moving average (TCP's smoothed RTT uses 1/8).
EWMA_WEIGHT = 0.125


class CommitLatency:
    """An exponentially weighted moving average of commit latencies, in milliseconds."""

    def __init__(self, ceiling_ms: int) -> None:
        self.ceiling_ms = max(ceiling_ms, LONG_WAIT_FLOOR_MS)
        self.average_ms = INITIAL_COMMIT_LATENCY_MS
        self.samples = 0

    def observe(self, latency_ms: float) -> None:
        if self.samples == 0:
            self.average_ms = latency_ms
        else:
            self.average_ms += EWMA_WEIGHT * (latency_ms - self.average_ms)
        self.samples += 1

    def long_wait_ms(self) -> int:
        """How long an append may wait before the partition asks the server to decide it."""
        wait_ms = int(LONG_WAIT_LATENCY_MULTIPLE * self.average_ms)
        return min(max(wait_ms, LONG_WAIT_FLOOR_MS), self.ceiling_ms)
