"""The operator's actions in the simulated world (waltz_engine/sim/operator.py) and the seams they
run through: the in-memory object store and its faults, the tier's rate limit owed to the loop,
and a seed in which the actions ran the product's code and kept their promises."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.sim import world as sim_world
from waltz_engine.sim.object_store import SIM_TIER_URL, SimBucket
from waltz_engine.sim.world import SimWorld, WorldShape, run_seed
from waltz_engine.storage.tier.offload import OffloadStopped, RateLimit


def test_the_simulated_store_writes_atomically_and_fails_as_told() -> None:
    bucket = SimBucket()
    store = bucket.seam().open_store(SIM_TIER_URL, "tier", "tmp/node")
    throttled: list[int] = []
    assert store.upload_chunks([b"ab", b"cd"], "p/0.seg", throttled.append) == 4
    assert throttled == [2, 2]
    store.write_bytes("tmp/node/debris", b"x")
    assert store.list_names("p") == ["0.seg"] and store.list_names() == []
    store.remove_debris()
    assert sorted(bucket.objects) == ["p/0.seg"]
    received: list[bytes] = []
    assert store.download_to("p/0.seg", 3, received.append) == store.checksum("p/0.seg", 3)
    assert received == [b"abc"]

    bucket.failing_puts = True
    with pytest.raises(ObjectStoreError, match="refused the put"):
        store.upload_chunks([b"zz"], "p/1.seg")
    assert "p/1.seg" not in bucket.objects  # a refused put leaves nothing
    bucket.heal()
    bucket.slow_put_factor = 10.0
    throttled.clear()
    store.upload_chunks([b"zz"], "p/1.seg", throttled.append)
    assert throttled == [20]  # a slow put costs the rate limit ten times its bytes
    bucket.failing_gets = True
    with pytest.raises(ObjectStoreError, match="answered an error"):
        store.read_bytes("p/0.seg")
    bucket.heal()
    assert store.read_bytes("p/0.seg") == b"abcd"


def test_a_rate_limit_that_may_not_block_owes_its_wait_to_the_loop() -> None:
    stopping = threading.Event()
    rate = RateLimit(1_000, stopping, blocking=False)
    rate.take(500)
    rate.take(1_500)  # no loop is running: its clock is the machine's, and nothing sleeps
    assert 1.9 < rate.take_owed_s() <= 2.0
    assert rate.take_owed_s() == 0.0
    stopping.set()
    with pytest.raises(OffloadStopped):
        rate.take(1)


def test_a_seed_runs_the_operators_actions_and_each_keeps_its_promise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}
    check_replicas = SimWorld.check_replicas

    def observe(world: SimWorld) -> list[str]:
        violations = check_replicas(world)
        firsts = {}
        for node in world.storage:
            manager = node.manager
            if manager is not None:
                try:
                    firsts[node.config.host] = manager.partition(0).first_transaction_id()
                except WaltzError:
                    continue  # not assigned (moved away)
        seen.update(firsts=firsts, moves=world.operator.moves_done, added=world.operator.added)
        seen.update(objects=len(world.bucket.objects), assigned=len(world.operator.assigned_nodes(0)))
        return violations

    monkeypatch.setattr(sim_world.SimWorld, "check_replicas", observe)
    result = run_seed(SEED_WITH_EVERY_ACTION, WorldShape())
    assert result.violations == []
    assert {"retention", "decommission", "storage_lost", "tier_fault"} <= set(result.faults)
    assert seen["moves"] >= 1 and seen["added"] == 1 and seen["assigned"] == 3
    assert "storage-3" in seen["firsts"]  # the added node took a replica
    assert seen["objects"]  # the tier offloaded


# A seed of the default world whose schedule holds a retention policy, a decommission, a node lost
# past the grace and a store fault (waltz sim --seeds 1 --seed-base 16); a move finished within the
# run. (Seeds 11 and then 8 were until moves waited for the replicas of record, issue 32's seed
# 154, and a restarted server removed its predecessor's registration: a decommission now often
# waits and is finished by the re-run at the end. Seed 10 was until a source that answers waited
# for its target to be recorded, seed 2159, and server faults left one server serving, seed 20360.
# Seed 12 was until a move waited for a session to record the replicas without its source and a
# slow replica was sent batches behind its unanswered ones, 2026-11-28's second session.)
SEED_WITH_EVERY_ACTION = 16
