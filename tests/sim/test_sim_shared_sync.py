"""Issue 33: a simulated world of several partitions (``waltz sim --partitions``) runs its storage
nodes' disk passes of several partitions through the one whole-disk sync (the simulated disk's
``sync_all``), and its checks pass; the default worlds have one partition and never take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz_engine.sim.disk import SimDisk
from waltz_engine.sim.world import WorldShape, run_seed

# A seed of the 4-partition world whose passes sync several partitions together (4 times).
SEED = 4


def test_a_world_of_several_partitions_syncs_its_passes_together(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[Path] = []
    sync_all = SimDisk.sync_all

    def counted(self: SimDisk, directory: Path) -> None:
        syncs.append(directory)
        sync_all(self, directory)

    monkeypatch.setattr(SimDisk, "sync_all", counted)
    assert run_seed(SEED, WorldShape(partitions=4)).violations == []
    assert syncs
