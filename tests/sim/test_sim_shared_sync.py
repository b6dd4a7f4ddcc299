"""Issue 33: a simulated world of several partitions (``waltz sim --partitions``, as many
transactions submitted at once) runs its storage nodes' disk passes of several partitions through
the one whole-disk sync (the simulated disk's ``sync_all``), and its checks pass; the default
worlds have one partition and never take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from waltz_engine.sim.disk import SimDisk
from waltz_engine.sim.runner import replay_command
from waltz_engine.sim.world import WorldShape, run_seed

# A seed of the 4-partition world (`waltz sim --partitions 4`), whose passes sync several
# partitions together 16 times (4 before its transactions were submitted 4 at once: seed 4).
SEED = 0
SHAPE = WorldShape(partitions=4, submits_together=4)


def test_a_world_of_several_partitions_syncs_its_passes_together(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[Path] = []
    sync_all = SimDisk.sync_all

    def counted(self: SimDisk, directory: Path) -> None:
        syncs.append(directory)
        sync_all(self, directory)

    monkeypatch.setattr(SimDisk, "sync_all", counted)
    assert run_seed(SEED, SHAPE).violations == []
    assert syncs


def test_a_failing_seed_of_several_partitions_replays_with_them() -> None:
    command = replay_command(SEED, SHAPE)
    assert command.endswith(f"--seed-base {SEED} --transactions 100 --faults 30 --partitions 4")
