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

# A seed of the 4-partition world (`waltz sim --partitions 4`): its passes sync several partitions
# together 47 times (4 in seed 4 before its transactions were submitted 4 at once), and 5 of those
# whole-disk syncs fail (the fault whole_sync_failure): each fails its pass's partitions, cut back.
SEED = 7
SHAPE = WorldShape(partitions=4, submits_together=4)


def test_a_world_of_several_partitions_syncs_its_passes_together(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[Path] = []
    failed: list[OSError] = []
    sync_all = SimDisk.sync_all

    def counted(self: SimDisk, directory: Path) -> None:
        syncs.append(directory)
        try:
            sync_all(self, directory)
        except OSError as e:
            failed.append(e)
            raise

    monkeypatch.setattr(SimDisk, "sync_all", counted)
    result = run_seed(SEED, SHAPE)
    assert result.violations == []
    assert len(syncs) > len(failed) > 0 and result.faults["whole_sync_failure"] > 0


def test_a_failing_seed_of_several_partitions_replays_with_them() -> None:
    command = replay_command(SEED, SHAPE)
    assert command.endswith(f"--seed-base {SEED} --transactions 100 --faults 30 --partitions 4")
