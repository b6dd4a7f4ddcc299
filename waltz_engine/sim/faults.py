"""The faults a seed injects into its world, every choice drawn from the seed's generator.

Network faults between pairs of hosts (see :class:`waltz_engine.sim.network.SimNetwork`): a
reset of their connections, a partition, one-way loss, a slow link, a link of spiky latency;
a ZooKeeper outage (:class:`waltz_engine.sim.zk_model.SimZooKeeper`: every client loses
its connection, sessions expire after their timeout); and, given ``nodes``, the faults of whole
nodes (:mod:`waltz_engine.sim.node_faults`: pauses, crashes, session expiry, partitions moved).
Each but the reset is healed after a while; by ``window_s + MAX_FAULT_S`` all is whole again, so
a correct cluster always finishes its workload.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from waltz_engine.sim.loop import SimLoop
from waltz_engine.sim.network import Latency, SimNetwork
from waltz_engine.sim.node_faults import NODE_FAULT_KINDS, NodeFaults, node_fault_kinds
from waltz_engine.sim.operator import OPERATOR_KINDS
from waltz_engine.sim.zk_model import SimZooKeeper

FAULT_KINDS = ("reset", "partition", "drop", "slow", "latency", "zookeeper_outage")
# The default mix (``waltz sim`` and WorldShape): this many faults per seed of the default 100
# transactions, each of a kind drawn from every kind there is (network, ZooKeeper, node, disk).
DEFAULT_FAULTS = 30
# The longest a fault lasts before its link heals.
MAX_FAULT_S = 20.0
MIN_FAULT_S = 0.05
SLOW_FACTORS = (2.0, 50.0)
SPIKY = Latency(min_s=0.001, max_s=0.2, spike_probability=0.05, spike_s=1.0)


async def inject_faults(
    loop: SimLoop,
    network: SimNetwork,
    zookeeper: SimZooKeeper,
    pairs: Sequence[tuple[str, str]],
    count: int,
    window_s: float,
    nodes: NodeFaults | None = None,
) -> collections.Counter[str]:
    """``count`` faults at random times within ``window_s``; returns how many of each kind."""
    rng = loop.rng
    started_s = loop.time()
    injected: collections.Counter[str] = collections.Counter()
    kinds = FAULT_KINDS + (node_fault_kinds(nodes.world) if nodes is not None else ())
    for at_s in sorted(rng.uniform(0, window_s) for _ in range(count)):
        await asyncio.sleep(max(0.0, started_s + at_s - loop.time()))
        a, b = rng.choice(pairs)
        kind = rng.choice(kinds)
        injected[kind] += 1
        if nodes is not None and kind in NODE_FAULT_KINDS + OPERATOR_KINDS:
            nodes.inject(kind, rng)
            continue
        if kind == "reset":
            network.reset(a, b)
            continue
        if kind == "zookeeper_outage":
            if not zookeeper.in_outage:
                zookeeper.start_outage()
                loop.call_later(rng.uniform(MIN_FAULT_S, MAX_FAULT_S), zookeeper.end_outage)
            continue
        if kind == "partition":
            network.partition(a, b)
        elif kind == "drop":
            network.drop(*((a, b) if rng.random() < 0.5 else (b, a)))
        elif kind == "slow":
            network.slow(a, b, rng.uniform(*SLOW_FACTORS))
        else:
            network.set_latency(a, b, SPIKY)
        loop.call_later(rng.uniform(MIN_FAULT_S, MAX_FAULT_S), network.heal, a, b)
    return injected
