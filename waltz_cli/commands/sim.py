"""`waltz sim`: the deterministic simulator over many seeds (a thin skin over
:mod:`waltz_engine.sim.runner`): exit 0 only when no seed violates."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Annotated

import typer

from waltz_cli.options import JsonOption
from waltz_cli.output import one_line_errors, print_json
from waltz_engine.sim.faults import DEFAULT_FAULTS
from waltz_engine.sim.runner import MAX_JOBS, MAX_SEEDS, run_seeds
from waltz_engine.sim.world import (
    DEFAULT_TRANSACTIONS,
    MAX_FAULTS,
    MAX_TRANSACTIONS,
    WORKLOADS,
    SeedResult,
    WorldShape,
)
from waltz_engine.sim.world_acl import ACL_MIN_PARTITIONS

# The most partitions a simulated cluster has (each costs every node its files and workers).
MAX_SIM_PARTITIONS = 16


@one_line_errors
def sim(
    seeds: Annotated[int, typer.Option("--seeds", help="How many seeds to run.", min=1, max=MAX_SEEDS)] = 100,
    seed_base: Annotated[int, typer.Option("--seed-base", help="The first seed.", min=0)] = 0,
    jobs: Annotated[int, typer.Option("--jobs", help="Processes to run seeds on.", min=1, max=MAX_JOBS)] = 1,
    transactions: Annotated[
        int,
        typer.Option("--transactions", help="Transactions per seed.", min=1, max=MAX_TRANSACTIONS),
    ] = DEFAULT_TRANSACTIONS,
    faults: Annotated[
        int,
        typer.Option(
            "--faults",
            help=f"Faults per seed, each of a kind drawn from all: network (resets, partitions, loss, "
            "slow and spiky links), ZooKeeper outages and expiries, server pauses and freezes, power "
            "losses of servers and storage nodes, partition moves, forged reads, client restarts, "
            "disk faults (torn writes, bit flips, a full disk, slow syncs; with --partitions, failed "
            "whole-disk syncs). The default is the mix "
            f"the simulator's targets are measured at ({DEFAULT_FAULTS} per seed of "
            f"{DEFAULT_TRANSACTIONS} transactions); 0 for a world without faults.",
            min=0,
            max=MAX_FAULTS,
            show_default=False,  # the help says it
        ),
    ] = DEFAULT_FAULTS,
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            help="append: numbered transactions; bank: transfers under optimistic locks (no overdraft, "
            "no lost update).",
        ),
    ] = "append",
    acl: Annotated[
        bool,
        typer.Option(
            "--acl",
            help="ACLs on: each connection carries its host's principal; the client is refused the "
            "appends of one partition and the reads of another (3 partitions).",
        ),
    ] = False,
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            help="Partitions of the simulated cluster (the transactions go round them, submitted as "
            "many at once): with several, a storage node's disk passes carry several partitions, "
            "made durable by one whole-disk sync (the append workload). --acl makes it at least "
            f"{ACL_MIN_PARTITIONS}.",
            min=1,
            max=MAX_SIM_PARTITIONS,
        ),
    ] = 1,
    as_json: JsonOption = False,
) -> None:
    """Run real storage nodes, two servers and a client in the simulator, one seeded world per seed.

    Each seed runs on a virtual clock, an in-memory network, disk and ZooKeeper.

    Faults: the default mix unless --faults says otherwise (see --faults).

    Checked: every outcome against the log; the data read, the replicas, an export-style read.

    A failing seed prints its replay command and its last events.

    With --json stdout holds only the report: seeds, violations, failing_seeds, trace_hash, transactions,
    cpu_s and cpu_s_per_seed (CPU seconds, summed over the processes).

    Example: waltz sim --seeds 300 (the default mix); waltz sim --seeds 200 --faults 0 --json
    """

    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")

    def progress(result: SeedResult) -> None:
        if not as_json and result.violations:
            print(f"seed {result.seed}: {len(result.violations)} violations", file=sys.stderr, flush=True)

    if partitions > 1 and workload != "append":
        raise typer.BadParameter(f"the {workload} workload runs on one partition (its checks read one log)")
    shape = WorldShape(transactions=transactions, faults=faults, workload=workload, acl=acl)
    shape = replace(shape, partitions=partitions, submits_together=partitions)
    if acl:
        shape = replace(shape, partitions=max(partitions, ACL_MIN_PARTITIONS))
    report = run_seeds(seeds, seed_base, jobs, progress, shape)
    if as_json:
        print_json(report.to_json())
    else:
        for line in report.lines():
            print(line)
    raise typer.Exit(0 if report.passed else 1)
