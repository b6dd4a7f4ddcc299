"""A small metrics registry: gauges, counters, meters and timers, bounded in memory.

Rendered in the JSON shape of the original's ``/metrics`` (Dropwizard/codahale metrics:
``{"version", "gauges", "counters", "histograms", "meters", "timers"}``, names
``<group>.<name>``) and as Prometheus text for ``/metrics/prometheus``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Any

from waltz_engine.common import clock

METRICS_JSON_VERSION = "4.0.0"
# EWMA tick as Dropwizard's meters: rates decay every 5 s.
TICK_INTERVAL_S = 5.0
# A timer keeps this many most recent samples for its quantiles (Dropwizard's reservoir size).
TIMER_RESERVOIR_SIZE = 1028
_M1_ALPHA = 1 - math.exp(-TICK_INTERVAL_S / 60.0)
_M5_ALPHA = 1 - math.exp(-TICK_INTERVAL_S / 300.0)
_M15_ALPHA = 1 - math.exp(-TICK_INTERVAL_S / 900.0)


class Counter:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count}


class Meter:
    """Event count with mean and exponentially weighted 1/5/15-minute rates (events/s)."""

    __slots__ = ("count", "_start_s", "_last_tick_s", "_uncounted", "_m1", "_m5", "_m15", "_primed")

    def __init__(self) -> None:
        now = clock.monotonic_s()
        self.count = 0
        self._start_s = now
        self._last_tick_s = now
        self._uncounted = 0
        self._m1 = self._m5 = self._m15 = 0.0
        self._primed = False

    def mark(self, n: int = 1) -> None:
        # (The tick tested inline: three marks per lone commit on a server, two per append on a node.)
        now = clock.monotonic_s()
        if now - self._last_tick_s >= TICK_INTERVAL_S:
            self._tick(now)
        self.count += n
        self._uncounted += n

    def mark_at(self, now_s: float, n: int = 1) -> None:
        """:meth:`mark` with the clock read by the caller (``clock.monotonic_s()``, this very
        moment): one read for several meters and timers (a server's decided batch, a storage
        node's append)."""
        if now_s - self._last_tick_s >= TICK_INTERVAL_S:
            self._tick(now_s)
        self.count += n
        self._uncounted += n

    def _tick_if_due(self) -> None:
        self._tick(clock.monotonic_s())

    def _tick(self, now: float) -> None:
        ticks = int((now - self._last_tick_s) // TICK_INTERVAL_S)
        if ticks <= 0:
            return
        self._last_tick_s += ticks * TICK_INTERVAL_S
        for _ in range(min(ticks, 200)):  # after 200 idle ticks every rate is ~0 anyway
            instant = self._uncounted / TICK_INTERVAL_S
            self._uncounted = 0
            if self._primed:
                self._m1 += _M1_ALPHA * (instant - self._m1)
                self._m5 += _M5_ALPHA * (instant - self._m5)
                self._m15 += _M15_ALPHA * (instant - self._m15)
            else:
                self._m1 = self._m5 = self._m15 = instant
                self._primed = True

    def mean_rate(self) -> float:
        elapsed_s = clock.monotonic_s() - self._start_s
        return self.count / elapsed_s if elapsed_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        self._tick_if_due()
        return {
            "count": self.count,
            "m15_rate": self._m15,
            "m1_rate": self._m1,
            "m5_rate": self._m5,
            "mean_rate": self.mean_rate(),
            "units": "events/second",
        }


class Timer:
    """Durations (reported in milliseconds) with a bounded reservoir and a meter of calls."""

    __slots__ = ("meter", "_samples_ms", "_next")

    def __init__(self) -> None:
        self.meter = Meter()
        self._samples_ms: list[float] = []
        self._next = 0

    def update_ms(self, duration_ms: float) -> None:
        # (Not through update_at: a storage node calls it per append, and a call costs.)
        self.meter.mark()
        if len(self._samples_ms) < TIMER_RESERVOIR_SIZE:
            self._samples_ms.append(duration_ms)
        else:
            self._samples_ms[self._next] = duration_ms
            self._next = (self._next + 1) % TIMER_RESERVOIR_SIZE

    def update_at(self, now_s: float, duration_ms: float, n: int = 1) -> None:
        """``n`` durations of ``duration_ms`` (a group commit's requests), the clock read by the
        caller at their end: :meth:`update_ms` ``n`` times, without a clock read each."""
        self.meter.mark_at(now_s, n)
        samples = self._samples_ms
        for _ in range(n):
            if len(samples) < TIMER_RESERVOIR_SIZE:
                samples.append(duration_ms)
            else:
                samples[self._next] = duration_ms
                self._next = (self._next + 1) % TIMER_RESERVOIR_SIZE

    def quantile_ms(self, q: float) -> float:
        if not self._samples_ms:
            return 0.0
        ordered = sorted(self._samples_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def to_json(self) -> dict[str, Any]:
        samples = sorted(self._samples_ms)
        n = len(samples)

        def q(p: float) -> float:
            return samples[min(n - 1, int(p * n))] if n else 0.0

        mean = sum(samples) / n if n else 0.0
        stddev = math.sqrt(sum((s - mean) ** 2 for s in samples) / n) if n else 0.0
        out: dict[str, Any] = {
            "count": self.meter.count,
            "max": samples[-1] if n else 0.0,
            "mean": mean,
            "min": samples[0] if n else 0.0,
            "p50": q(0.5),
            "p75": q(0.75),
            "p95": q(0.95),
            "p98": q(0.98),
            "p99": q(0.99),
            "p999": q(0.999),
            "stddev": stddev,
        }
        meter = self.meter.to_json()
        del meter["count"], meter["units"]
        out.update(meter)
        out["duration_units"] = "milliseconds"
        out["rate_units"] = "calls/second"
        return out


class MetricsRegistry:
    """Named metrics ``<group>.<name>``; safe to register and read from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gauges: dict[str, Callable[[], Any]] = {}
        self._counters: dict[str, Counter] = {}
        self._meters: dict[str, Meter] = {}
        self._timers: dict[str, Timer] = {}

    def gauge(self, group: str, name: str, read: Callable[[], Any]) -> None:
        with self._lock:
            self._gauges[f"{group}.{name}"] = read

    def counter(self, group: str, name: str) -> Counter:
        with self._lock:
            return self._counters.setdefault(f"{group}.{name}", Counter())

    def meter(self, group: str, name: str) -> Meter:
        with self._lock:
            return self._meters.setdefault(f"{group}.{name}", Meter())

    def timer(self, group: str, name: str) -> Timer:
        with self._lock:
            return self._timers.setdefault(f"{group}.{name}", Timer())

    def remove_group(self, group: str) -> None:
        """Unregister every metric of a group (a closed partition must not report stale values)."""
        prefix = group + "."
        with self._lock:
            for table in (self._gauges, self._counters, self._meters, self._timers):
                for key in [k for k in table if k.startswith(prefix)]:
                    del table[key]

    def _snapshot(
        self,
    ) -> tuple[dict[str, Callable[[], Any]], dict[str, Counter], dict[str, Meter], dict[str, Timer]]:
        with self._lock:
            return dict(self._gauges), dict(self._counters), dict(self._meters), dict(self._timers)

    def to_json(self) -> dict[str, Any]:
        gauges, counters, meters, timers = self._snapshot()
        return {
            "version": METRICS_JSON_VERSION,
            "gauges": {k: {"value": _read_gauge(v)} for k, v in sorted(gauges.items())},
            "counters": {k: c.to_json() for k, c in sorted(counters.items())},
            "histograms": {},
            "meters": {k: m.to_json() for k, m in sorted(meters.items())},
            "timers": {k: t.to_json() for k, t in sorted(timers.items())},
        }

    def to_prometheus(self) -> str:
        """Prometheus text exposition (version 0.0.4); non-numeric gauges are left out."""
        gauges, counters, meters, timers = self._snapshot()
        lines: list[str] = []
        for key, read in sorted(gauges.items()):
            value = _read_gauge(read)
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float):
                name = _prom_name(key)
                lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        for key, c in sorted(counters.items()):
            name = _prom_name(key) + "_total"
            lines += [f"# TYPE {name} counter", f"{name} {c.count}"]
        for key, m in sorted(meters.items()):
            name = _prom_name(key) + "_total"
            lines += [f"# TYPE {name} counter", f"{name} {m.count}"]
        for key, t in sorted(timers.items()):
            name = _prom_name(key) + "_seconds"
            lines.append(f"# TYPE {name} summary")
            for q in (0.5, 0.95, 0.99):
                lines.append(f'{name}{{quantile="{q}"}} {t.quantile_ms(q) / 1000.0}')
            lines.append(f"{name}_sum {sum(t._samples_ms) / 1000.0}")
            lines.append(f"{name}_count {t.meter.count}")
        return "\n".join(lines) + "\n"


def _read_gauge(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as e:  # a broken gauge must not take the whole endpoint down
        return f"error: {e}"


_PROM_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def _prom_name(key: str) -> str:
    name = _PROM_INVALID.sub("_", key)
    return name if not name[0].isdigit() else "_" + name
