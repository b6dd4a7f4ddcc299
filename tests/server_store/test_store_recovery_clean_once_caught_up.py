"""A recovery records a replica clean in its session only once the replica caught up.

A replica that does not vote (here one ZooKeeper gives a closing mark: it missed the end of an
earlier session) is truncated to that mark and catches up from the others. The recovery recorded
it clean in the new session as soon as it reported, as the original does (which sets the low-water
mark before the catch-up; here it is set once caught up). The catch-up then failed (the simulator's
seed 41020 of issue 32: a full disk), and ZooKeeper had the replica at the new session while its
disk kept the older one: every later recovery took it for a disk restored from an old copy, blind
above its mark, and with rot in a record on another replica no recovery could decide, for good.
Now a replica is recorded clean in a session once it holds the session's committed prefix and its
disk took the session (its low-water mark set); until then it keeps its earlier state, the
original's rule for a replica that did not finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, make_records
from store_cluster_support import (
    StorageCluster,
    begin_open,
    bounded,
    caught_up,
    holds_exactly,
    metadata,
    node_connect_string,
    open_store,
    read_all,
    register,
    replica_state,
    set_up_storage,
    stoppable_cluster,
    storage_state,
    wait_until,
    wait_until_async,
    write_metadata,
)

from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK, ReplicaState

PARTITION_ID = 0
GENERATION = 3
PREVIOUS_SESSION_ID = ISSUED_SESSION_ID
NEW_SESSION_ID = PREVIOUS_SESSION_ID + 1
COMMITTED_TXID = 30  # the two voters' end, committed
# The lagging replica: its disk's session (ZooKeeper's record of it too) with its low-water mark,
# the closing mark ZooKeeper gives it, and a dirty tail above that mark.
LAGGING_SESSION_ID = PREVIOUS_SESSION_ID - 1
LAGGING_LOW_WATER_MARK = 8
CLOSING_MARK = 10
LAGGING_TAIL_TXID = 14


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with stoppable_cluster(zookeeper, tmp_path, 3, 1) as storage_cluster:
        yield storage_cluster


def _recorded(states: tuple[ReplicaState, ...], storage: str) -> tuple[int, int]:
    (state,) = [s for s in states if s.replica_id.storage == storage]
    return state.session_id, state.closing_high_water_mark


def test_a_replica_that_does_not_vote_is_recorded_clean_only_once_caught_up(
    cluster: StorageCluster, zookeeper: str
) -> None:
    voter_one, voter_two, lagging = cluster.nodes

    async def go() -> None:
        # The voters answer only once the lagging replica reported and was truncated: it is then
        # in the recovery before the quorum of voters ends it (else nothing records it at all).
        proxies = [await TcpProxy(node.host, node.port).start() for node in (voter_one, voter_two)]
        for proxy in proxies:
            proxy.refuse = True
        voters = [proxy.connect_string for proxy in proxies]
        storages = [*voters, node_connect_string(lagging)]
        stopped = False
        try:
            with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
                for name, node in zip(storages, cluster.nodes, strict=True):
                    register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
                for node in (voter_one, voter_two):
                    await set_up_storage(
                        node, PARTITION_ID, PREVIOUS_SESSION_ID, COMMITTED_TXID, COMMITTED_TXID
                    )
                await set_up_storage(
                    lagging, PARTITION_ID, LAGGING_SESSION_ID, LAGGING_LOW_WATER_MARK, LAGGING_TAIL_TXID
                )
                states = [
                    *(
                        replica_state(PARTITION_ID, s, PREVIOUS_SESSION_ID, UNRESOLVED_HIGH_WATER_MARK)
                        for s in voters
                    ),
                    replica_state(PARTITION_ID, storages[2], LAGGING_SESSION_ID, CLOSING_MARK),
                ]
                write_metadata(zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, states)
                store = await open_store(zk, cluster.root)
                try:
                    partition, opened = await begin_open(store, PARTITION_ID, GENERATION)
                    # Truncated to its closing mark: it reported, not voting. Its catch-up then
                    # hangs (as a full disk fails it): the node stops before the voters answer.
                    await wait_until_async(
                        lambda: holds_exactly(lagging, PARTITION_ID, CLOSING_MARK),
                        "the lagging replica truncated",
                    )
                    os.kill(lagging.pid, signal.SIGSTOP)
                    stopped = True
                    for proxy in proxies:
                        proxy.refuse = False
                    await bounded(opened)
                    assert partition.high_water_mark == COMMITTED_TXID
                    recorded = metadata(zk, cluster.root, PARTITION_ID)
                    assert recorded.session_id == NEW_SESSION_ID
                    for voter in voters:
                        assert _recorded(recorded.replica_states, voter) == (
                            NEW_SESSION_ID,
                            UNRESOLVED_HIGH_WATER_MARK,
                        )
                    # Not recorded clean in the new session (its disk still has the older one):
                    # its earlier state, as the original keeps a replica that did not finish.
                    assert _recorded(recorded.replica_states, storages[2]) == (
                        LAGGING_SESSION_ID,
                        CLOSING_MARK,
                    )

                    # Back, it catches up, and only then is recorded clean, in the session its
                    # disk took.
                    os.kill(lagging.pid, signal.SIGCONT)
                    stopped = False
                    await wait_until(
                        lambda: caught_up(partition.status(), storages), "every replica caught up"
                    )
                    info, max_transaction_id = await storage_state(lagging, PARTITION_ID)
                    assert max_transaction_id == COMMITTED_TXID
                    await wait_until(
                        lambda: (
                            _recorded(metadata(zk, cluster.root, PARTITION_ID).replica_states, storages[2])
                            == (info.session_id, UNRESOLVED_HIGH_WATER_MARK)
                        ),
                        "the caught-up replica recorded clean",
                    )
                    held = await read_all(lagging, PARTITION_ID, info.session_id, COMMITTED_TXID + 1)
                    assert held == make_records(0, COMMITTED_TXID + 1, PARTITION_ID)
                finally:
                    await store.close()
        finally:
            if stopped:
                os.kill(lagging.pid, signal.SIGCONT)
            for proxy in proxies:
                await proxy.close()

    asyncio.run(go())
