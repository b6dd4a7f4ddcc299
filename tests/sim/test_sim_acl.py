"""The simulator with ACLs on (issue 34): every connection carries its host's principal through
the network seam, the nodes enforce, and the seeds' checks hold: a refused append is never in
the log, a refused read never delivers, and the partition the client may use works through the
faults. A planted authorizer that allows everything makes the checks fail."""

from __future__ import annotations

import pytest

from waltz_engine.auth.authorizer import Authorizer
from waltz_engine.sim.world import WorldShape, run_seed
from waltz_engine.sim.world_acl import ACL_MIN_PARTITIONS

SHAPE = WorldShape(acl=True, partitions=ACL_MIN_PARTITIONS, transactions=30, faults=4)
# Seed 5: an append on the partition the client may only read went with the connection to a
# crashed server; its FLUSH was refused as an append, so nothing ever decided it.
SEEDS = (0, 1, 2, 5)


@pytest.mark.parametrize("seed", SEEDS)
def test_checks_hold_with_acls_on(seed: int) -> None:
    result = run_seed(seed, SHAPE)
    assert result.violations == []
    # Only the partition the client may append to committed; the other two ended refused (by the
    # ACLs, or by the application's own error on a retry after a flush proved an append absent).
    assert 0 < result.transactions <= SHAPE.transactions // ACL_MIN_PARTITIONS
    assert result.not_committed + result.refused >= 2 * SHAPE.transactions // ACL_MIN_PARTITIONS


def test_an_authorizer_that_allows_everything_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Authorizer, "allowed", lambda self, principal, operation, partition_id: True)
    violations = run_seed(0, WorldShape(acl=True, partitions=ACL_MIN_PARTITIONS, transactions=12)).violations
    assert any("the ACLs refuse it" in v for v in violations), violations
