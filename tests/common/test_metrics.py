from __future__ import annotations

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
    """``mark_at``/``update_ms_at`` (a server's batch reads the clock once for its commits):
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
        timer.update_ms_at(timer.meter._start_s, float(i))
    assert (timer.to_json()["count"], timer.to_json()["max"]) == (3, 2.0)
