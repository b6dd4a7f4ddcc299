from __future__ import annotations

from waltz_engine.common import clock
from waltz_engine.common.metrics import TICK_INTERVAL_S, TIMER_RESERVOIR_SIZE, Meter, MetricsRegistry


def test_timer_reservoir_is_bounded_and_quantiles_follow_recent_samples() -> None:
    timer = MetricsRegistry().timer("g", "t")
    for i in range(TIMER_RESERVOIR_SIZE * 3):
        timer.update_ms(float(i))
    snapshot = timer.to_json()
    assert snapshot["count"] == TIMER_RESERVOIR_SIZE * 3
    assert len(timer._samples_ms) == TIMER_RESERVOIR_SIZE
    assert snapshot["min"] >= TIMER_RESERVOIR_SIZE * 2  # only the most recent samples remain


def test_remove_group_unregisters_only_that_group() -> None:
    reg = MetricsRegistry()
    reg.gauge("waltz-storage.partition-1", "flags", lambda: 5)
    reg.meter("waltz-storage.partition-1", "append")
    reg.gauge("waltz-storage.partition-10", "flags", lambda: 1)
    reg.remove_group("waltz-storage.partition-1")
    assert list(reg.to_json()["gauges"]) == ["waltz-storage.partition-10.flags"]
    assert reg.to_json()["meters"] == {}


def test_a_failing_gauge_reports_its_error() -> None:
    reg = MetricsRegistry()
    reg.gauge("g", "broken", lambda: 1 // 0)
    assert reg.to_json()["gauges"]["g.broken"]["value"].startswith("error:")


def test_marks_and_samples_at_a_time_the_caller_read_count_and_tick_as_at_their_own() -> None:
    """``mark_at``/``update_at`` (a server's batch reads the clock once for its commits):
    each event counted, and the rates tick at the time given."""
    meter = Meter()
    started_s = meter._start_s
    meter.mark_at(started_s + 1.0, 5)
    meter.mark_at(started_s + TICK_INTERVAL_S + 0.5)  # one tick past: its rate is the first five's
    snapshot = meter.to_json()
    assert snapshot["count"] == 6
    assert snapshot["m1_rate"] == snapshot["m15_rate"] == 5 / TICK_INTERVAL_S
    timer = MetricsRegistry().timer("g", "t")
    for i in range(3):
        timer.update_at(timer.meter._start_s, float(i))
    assert (timer.to_json()["count"], timer.to_json()["max"]) == (3, 2.0)


def test_a_clock_read_shared_by_a_meter_and_a_timer_counts_as_marks_and_updates_do() -> None:
    """A storage node's append reads the clock once for its meter and its timer
    (``Meter.mark_at``, ``Timer.update_at``; a group's n requests in one call): the same counts,
    samples, reservoir bound and rates as ``mark`` and ``update_ms`` one at a time."""
    reg = MetricsRegistry()
    meter, timer = reg.meter("a", "m"), reg.timer("a", "t")
    one_meter, one_timer = reg.meter("b", "m"), reg.timer("b", "t")
    start_s = clock.monotonic_s()
    for i in range(TIMER_RESERVOIR_SIZE + 7):
        n = 1 + i % 3
        meter.mark_at(start_s, n)
        timer.update_at(start_s, float(i), n)
        one_meter.mark(n)
        for _ in range(n):
            one_timer.update_ms(float(i))
    assert meter.count == one_meter.count == timer.meter.count == one_timer.meter.count
    assert timer._samples_ms == one_timer._samples_ms and timer._next == one_timer._next
    assert len(timer._samples_ms) == TIMER_RESERVOIR_SIZE
    # A read past the tick interval ticks the rates (every uncounted event goes into them).
    meter.mark_at(start_s + 2 * TICK_INTERVAL_S)
    assert meter._uncounted == 1 and meter._m1 > 0
