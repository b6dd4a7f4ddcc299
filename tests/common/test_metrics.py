from __future__ import annotations

from waltz_engine.common.metrics import TIMER_RESERVOIR_SIZE, MetricsRegistry


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
