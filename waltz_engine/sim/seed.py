"""A seed's run in the simulated world, start to checks (the work of
:func:`waltz_engine.sim.world.run_seed`, kept apart for size)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from waltz_engine.sim.faults import inject_faults
from waltz_engine.sim.loop import SimLoop
from waltz_engine.sim.node_faults import NodeFaults
from waltz_engine.sim.storage_gone import StorageGone

if TYPE_CHECKING:
    from waltz_engine.sim.world import SimWorld

# A seed whose transactions are not all applied within this much virtual time has failed.
RUN_LIMIT_S = 600.0
# Every node fault is healed within this much virtual time of the workload's end.
HEAL_LIMIT_S = 120.0
# Tasks left by nodes that did not stop get this much virtual time to end once cancelled.
LEFTOVER_LIMIT_S = 10.0
LEFTOVER_ROUNDS = 5
# A healthy world's nodes stop within this much virtual time.
STOP_LIMIT_S = 120.0
# The simulator's nodes log only what goes wrong.
NODE_LOG_LEVEL = logging.ERROR
# A seed's collections leave the process's older objects out (gc.freeze); every this many seeds
# a full collection takes what they left (cyclic garbage of objects older than a seed).
FULL_COLLECTION_EVERY_SEEDS = 100
_seeds_since_full_collection = 0


async def run_world(world: SimWorld, faults_span_s: float, injected: dict[str, int]) -> list[str]:
    """Start the world, append the workload under the faults (spread over ``faults_span_s``),
    heal, check the replicas and an export-style read, stop: the violations found."""
    loop = world.loop
    shape = world.shape
    nodes = NodeFaults(loop, world)
    world.storage_gone = StorageGone(world, nodes, faults_span_s)
    await world.start()
    world.liveness.start()
    world.storage_gone.start()
    faults = loop.create_task(
        inject_faults(
            loop,
            world.network,
            world.zookeeper,
            world.fault_pairs(),
            shape.faults,
            faults_span_s,
            nodes,
        )
    )
    late = []
    try:
        async with asyncio.timeout(RUN_LIMIT_S):
            await world.append_all()
            injected.update(await faults)
    except TimeoutError:
        late = [f"not every transaction was applied within {RUN_LIMIT_S:.0f} s of virtual time"]
    finally:
        faults.cancel()
        world.storage_gone.healing_since_s = loop.time()
        try:
            async with asyncio.timeout(HEAL_LIMIT_S):
                await nodes.finish()  # every crashed node restarted, every pause over
        except TimeoutError:
            late.append(f"a crashed node did not restart within {HEAL_LIMIT_S:.0f} s")
        except Exception as e:  # a fault's healing that fails is a finding, not the end
            late.append(f"healing a fault raised {e!r}")
        world.heal()
        if shape.operator_actions:
            try:
                await world.operator.finish()  # moves a fault stopped, run again to their end
            except Exception as e:
                late.append(f"finishing the operator's moves raised {e!r}")
        try:
            late += world.check_replicas()
        except Exception as e:  # a replica that cannot be read at all is a finding
            late.append(f"reading the replicas raised {e!r} (dead: {sorted(world.dead)})")
        try:
            async with asyncio.timeout(STOP_LIMIT_S):
                late += await world.export_read()
        except TimeoutError:
            late.append(f"the export read did not end within {STOP_LIMIT_S:.0f} s of virtual time")
        except Exception as e:
            late.append(f"the export read raised {e!r}")
        world.liveness.stop()  # (the nodes stop next: nothing is owed)
        try:
            async with asyncio.timeout(STOP_LIMIT_S):
                await world.stop()
        except TimeoutError:
            late.append(f"the nodes did not stop within {STOP_LIMIT_S:.0f} s of virtual time")
        except Exception as e:  # a node that cannot stop cleanly is a finding too
            late.append(f"stopping the nodes raised {e!r}")
    if world.gone:  # (struck by its own plan, not drawn among the faults)
        injected["storage_gone"] = len(world.gone)
    return world.check() + late


def end_leftovers(loop: SimLoop) -> None:
    """What a node that did not stop cleanly left running ends on its own loop (not in a later
    seed's, or in the garbage collector at an arbitrary moment after the loop closed)."""
    loop.run_until_complete(_bury_the_dead(loop))
    # A task cancelled here may start another as it ends (a store session's failure schedules
    # its reopen): a few rounds, until none is left. The buried tasks are not counted: they never
    # end (counted, every round waited its whole limit for them while the nodes a failed stop
    # left ran on and started tasks the last round never cancelled, to be destroyed pending by
    # the collector after the loop closed: "Event loop is closed").
    for _ in range(LEFTOVER_ROUNDS):
        leftovers = loop.live_tasks()
        if not leftovers:
            break
        for task in leftovers:
            task.cancel()
        loop.run_until_complete(asyncio.wait(leftovers, timeout=LEFTOVER_LIMIT_S))
        for task in leftovers:
            if task.done() and not task.cancelled():
                task.exception()  # read: a task may end in its closed connection's error
    gc.collect()  # coroutines never scheduled close while their loop still runs callbacks
    loop.run_until_complete(asyncio.sleep(0))


async def _bury_the_dead(loop: SimLoop) -> None:
    """On the loop: the dead machines' coroutines close as code on a running loop."""
    loop.bury_the_dead()


@contextmanager
def seed_heap() -> Iterator[None]:
    """A seed's garbage collections examine only what the seed made: the objects the process
    already held (modules, caches, earlier seeds' results) are frozen for its time, so each
    collection, and :func:`end_leftovers`' full one, costs what the seed allocated rather than
    the whole heap (a fifth of a seed's CPU before). What is collected when does not change
    a trace: a seed's objects are collected as before, and the trace hash is the same."""
    global _seeds_since_full_collection
    if _seeds_since_full_collection >= FULL_COLLECTION_EVERY_SEEDS:
        _seeds_since_full_collection = 0
        gc.collect()
    _seeds_since_full_collection += 1
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def quiet_logs() -> Iterator[None]:
    root = logging.getLogger("waltz_engine")
    level = root.level
    root.setLevel(NODE_LOG_LEVEL)
    try:
        yield
    finally:
        root.setLevel(level)
