"""Reads go to the replica with the smallest cumulative expected latency (``LatencyWeightedRouter``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

DEFAULT_LATENCY_MS = 10
MAX_LATENCY_MS = 3_000
MIN_LATENCY_MS = 1


class LatencyWeightedRoute:
    """Expected latency is an EMA with weight 1/2; the weight approximates the cumulative latency."""

    def __init__(self) -> None:
        self.expected_latency_ms = DEFAULT_LATENCY_MS
        self.weight = 0

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    def update_expected_latency(self, latency_ms: float) -> None:
        clamped = min(max(int(latency_ms), MIN_LATENCY_MS), MAX_LATENCY_MS)
        self.expected_latency_ms = (self.expected_latency_ms + clamped) >> 1

    def update_weight(self) -> None:
        self.weight += self.expected_latency_ms


R = TypeVar("R", bound=LatencyWeightedRoute)


class LatencyWeightedRouter(Generic[R]):
    def __init__(self, routes: Sequence[R]) -> None:
        self._routes = list(routes)

    def get_route(self) -> R | None:
        """The open route of least weight (its weight grows at once, so concurrent reads spread)."""
        best: R | None = None
        for route in self._routes:
            if not route.closed and (best is None or route.weight < best.weight):
                best = route
        if best is not None:
            best.update_weight()
        return best
