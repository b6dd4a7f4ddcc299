"""A seed is one run in any process: worlds of several partitions (the servers' partition
assignment, ACLs) give the same trace in two processes, whatever their string hashing. Each seed
runs in fresh interpreters, as `waltz sim` replays a seed another process reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from waltz_engine.sim.world_acl import ACL_MIN_PARTITIONS

RUN_BOUND_S = 300
SHAPES = {
    "partitions": "WorldShape(partitions=3, transactions=30, faults=0)",
    "acl": f"WorldShape(acl=True, partitions={ACL_MIN_PARTITIONS}, transactions=30, faults=4)",
}


def _trace_hashes(seed: int, shape: str) -> list[str]:
    code = (
        "from waltz_engine.sim.world import WorldShape, run_seed\n"
        f"r = run_seed({seed}, {shape})\n"
        "print(r.trace_hash, len(r.violations))\n"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            stdout=subprocess.PIPE,
            text=True,
        )
        for hash_seed in ("1", "2")
    ]
    outputs = [run.communicate(timeout=RUN_BOUND_S)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    return outputs


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_seed_of_several_partitions_is_the_same_run_in_two_processes(shape: str) -> None:
    first, second = _trace_hashes(0, SHAPES[shape])
    assert first == second
    assert first.split()[1] == "0"  # and a clean one
