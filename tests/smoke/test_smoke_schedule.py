"""The smoke test's fault schedule: seeded, and the invariants hold for any seed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_engine.smoke.schedule import (
    SERVERS,
    STORAGES,
    Fault,
    FaultKind,
    ScheduleParams,
    make_schedule,
    max_storages_down,
)

SMOKE_DURATION_S = 120.0
MIN_FAULTS_IN_TWO_MINUTES = 20
FLOAT_SLACK_S = 1e-9  # at_s + down_s in binary floating point


def test_the_same_seed_gives_the_same_schedule() -> None:
    params = ScheduleParams(SMOKE_DURATION_S)
    assert make_schedule(42, params) == make_schedule(42, params)
    assert make_schedule(42, params) != make_schedule(43, params)


def test_max_storages_down_sees_two_overlapping_storage_faults() -> None:
    # The invariant's own measure must be able to fail, or the property test below proves nothing.
    overlapping = [
        Fault(1.0, FaultKind.KILL, STORAGES[0], 5.0),
        Fault(2.0, FaultKind.PAUSE, STORAGES[1], 5.0),
    ]
    assert max_storages_down(overlapping) == 2


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**63), duration_s=st.floats(min_value=20, max_value=900))
def test_invariants_hold_for_any_seed(seed: int, duration_s: float) -> None:
    params = ScheduleParams(duration_s)
    faults = make_schedule(seed, params)
    assert max_storages_down(faults) <= 1
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    for fault in faults:
        assert (
            params.warm_up_s <= fault.at_s
            and fault.until_s <= duration_s - params.cool_down_s + FLOAT_SLACK_S
        )
        if fault.kind.takes_down and fault.target in SERVERS:
            overlapping = [
                f
                for f in faults
                if f is not fault
                and f.target in SERVERS
                and f.kind.takes_down
                and f.at_s <= fault.at_s < f.until_s
            ]
            assert not overlapping, f"{fault} while {overlapping}"
        if fault.kind is FaultKind.STORAGE_DISCONNECT:
            down = {
                f.target
                for f in faults
                if f.target in STORAGES and f.kind.takes_down and f.at_s <= fault.at_s < f.until_s
            }
            assert not down or down == {fault.target}


@given(seed=st.integers(min_value=0, max_value=2**31))
@settings(max_examples=50, deadline=None)
def test_two_minutes_hold_enough_faults(seed: int) -> None:
    assert len(make_schedule(seed, ScheduleParams(SMOKE_DURATION_S))) >= MIN_FAULTS_IN_TWO_MINUTES
