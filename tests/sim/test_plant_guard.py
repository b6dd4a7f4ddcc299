"""The planted bugs' guard (``plant_guard``): a plant that fails by a programming error of its own
fails its test, named, instead of being "found" by the world's checks; AssertionError (our
invariants) passes through unrecorded; every plant of today fits the code it patches."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from plant_guard import Patch, PlantError, plant
from planted_bugs import PLANTS

from waltz_engine.sim.world import WorldShape, run_seed
from waltz_engine.storage.segment import Segment

# A small world and a seed of it that today's code passes and that a plant failing every lone
# append makes fail (1 s; the default world's seed 0 took 16 s of the suite's CPU for the same case).
SMALL_WORLD = WorldShape(transactions=20, faults=5, operator_actions=False, storage_gone=False)
SEED = 1


class _Patched:
    def call(self, value: int) -> int:
        return value

    async def call_async(self, value: int) -> int:
        return value


def test_a_replacement_that_does_not_fit_fails_as_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    def stale(patch: Patch) -> None:
        patch.setattr(_Patched, "call", lambda self: 0)  # (today's takes a value)

    with pytest.raises(PlantError, match=r"plant stale: its _Patched.call\(self\) does not fit"):
        plant("stale", stale, monkeypatch)


def test_a_programming_error_in_a_replacement_is_recorded_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(patch: Patch) -> None:
        patch.setattr(_Patched, "call", lambda self, value: self.renamed)

        async def call_async(self: _Patched, value: int) -> int:
            return int(undefined_name)  # type: ignore[name-defined]  # noqa: F821

        patch.setattr(_Patched, "call_async", call_async)

    guard = plant("broken", broken, monkeypatch)
    with pytest.raises(AttributeError):  # re-raised: the world sees what it saw before
        _Patched().call(1)
    with pytest.raises(NameError):
        asyncio.run(_Patched().call_async(1))
    with pytest.raises(PlantError, match="plant broken failed by a programming error") as failed:
        guard.check()
    assert "_Patched.call: AttributeError" in str(failed.value)
    assert "_Patched.call_async: NameError" in str(failed.value)


def test_an_assertion_of_an_invariant_is_not_a_plant_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def invariant(self: _Patched, value: int) -> int:
        assert value > 1, "an invariant the planted bug breaks: a finding of the bug"
        return value

    guard = plant("invariant", lambda patch: patch.setattr(_Patched, "call", invariant), monkeypatch)
    with pytest.raises(AssertionError):
        _Patched().call(1)
    guard.check()


def test_a_plant_left_behind_by_a_signature_change_is_caught_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33's case: ``ack_before_sync`` wrapped ``Segment._write`` with ``*args`` and called it
    as it was before it took more arguments, so every append failed with a TypeError, and the
    seed's checks reported those failures as the plant's finding. A lone append is written by
    ``Segment.append_record`` now (issue 33's fifth session), so the case is played there."""
    assert run_seed(SEED, SMALL_WORLD).violations == []  # today's code passes the seed
    append_record = Segment.append_record

    def append_as_before(self: Segment, *args: Any) -> None:
        append_record(self, *args[:-1])  # (one argument short)

    guard = plant(
        "ack_before_sync", lambda p: p.setattr(Segment, "append_record", append_as_before), monkeypatch
    )
    violations = run_seed(SEED, SMALL_WORLD).violations
    assert violations, "the world did not fail: no longer the case this guard is for"
    with pytest.raises(PlantError, match=r"plant ack_before_sync failed by a programming error .*TypeError"):
        guard.check()


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_every_plant_fits_the_code_it_patches(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(name, PLANTS[name], monkeypatch).check()
