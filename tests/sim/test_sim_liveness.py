"""The liveness check and the node lost for good (waltz_engine/sim/liveness.py, storage_gone.py):
a seed that loses a node for good ends with its replicas moved and nothing owed, and a seed the
loss does not strike keeps its schedule (the check only reads). The check's finding is the
plant ``move_ends_unrecorded_unchecked`` (test_sim_finds_planted_bugs)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from waltz_engine.sim import world as sim_world
from waltz_engine.sim.liveness import LIVENESS_BOUND_MS
from waltz_engine.sim.storage_gone import AFTER_MOVE_SHARE, AT_TIME_SHARE
from waltz_engine.sim.world import SimWorld, WorldShape, run_seed

# A seed of the default world that loses storage-2 for good right after a decommission returned
# (waltz sim --seeds 1 --seed-base 31); the servers' auto-recovery moves its replica.
SEED_LOSING_A_NODE = 31
# A seed the loss does not strike (its own generator draws above both shares).
SEED_WITHOUT_THE_LOSS = 0


def test_the_bound_is_the_products_timeouts_summed() -> None:
    assert LIVENESS_BOUND_MS == 30_000 + 20_000 + 10_000


def test_a_node_lost_for_good_has_its_replicas_moved_and_the_log_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}
    check_replicas = SimWorld.check_replicas

    def observe(world: SimWorld) -> list[str]:
        seen.update(gone=set(world.gone), assigned=len(world.operator.assigned_nodes(0)))
        seen.update(lost_assigned=world.operator.assigned_gone(0), samples=world.liveness._high_water_marks)
        return check_replicas(world)

    monkeypatch.setattr(sim_world.SimWorld, "check_replicas", observe)
    result = run_seed(SEED_LOSING_A_NODE, WorldShape())
    assert result.violations == []
    assert result.faults["storage_gone"] == 1 and seen["gone"] == {2}
    assert seen["assigned"] == 3 and seen["lost_assigned"] == 0  # re-replicated, the lost one out
    assert seen["samples"][0] >= 0  # the check looked at the partition's commits


def test_a_seed_the_loss_does_not_strike_keeps_its_schedule() -> None:
    draw = random.Random(f"storage_gone {SEED_WITHOUT_THE_LOSS}").random()
    assert draw >= AT_TIME_SHARE + AFTER_MOVE_SHARE
    with_loss = run_seed(SEED_WITHOUT_THE_LOSS, WorldShape())
    without = run_seed(SEED_WITHOUT_THE_LOSS, WorldShape(storage_gone=False))
    assert with_loss.violations == without.violations == []
    assert "storage_gone" not in with_loss.faults
    assert with_loss.trace_hash == without.trace_hash
