"""A replica of the previous session that does not vote does not outvote a committed record.

A replica whose storage session is older than ZooKeeper's (a node the partition was moved away
from and back onto: unassigning resets its session) does not vote, and the recovery truncates it
to its low-water mark. Its report then says nothing of the records above that mark, which it may
have held committed. Counted as a replica that never had them, it let a lagging voter outvote the
one other holder of a committed record: the mark was resolved below it (the simulator's seeds 1120
and 1780 of issue 32, a decommission's source moved back as another move's target while the third
replica lagged after a power loss; a moved-in replica's low-water mark refused the cut there, and
every recovery failed on it, for good). Above its mark it now counts as absent: the lagging voter
catches up from the holder first, and the mark resolves at the committed end. With the holder
not answering, the lagging voter and the moved-back replica (caught up to the lagging one) are no
quorum that lacks a record: nothing is decided until the holder answers.
"""

from __future__ import annotations

import asyncio
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
    node_connect_string,
    open_store,
    read_all,
    register,
    set_up_storage,
    started_cluster,
    wait_until,
    wait_until_async,
    write_clean_metadata,
)

from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.zk.connection import ZooKeeperSettings, connect

PARTITION_ID = 0
GENERATION = 3
PREVIOUS_SESSION_ID = ISSUED_SESSION_ID
OLDER_SESSION_ID = PREVIOUS_SESSION_ID - 1  # the moved-back replica's control file
MARK = 2  # every replica's low-water mark: records up to here were committed before
COMMITTED_TXID = 12  # committed on the holder and the moved-back replica
LAGGING_TXID = 4  # the lagging voter's end (it lost the rest in a power loss)


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with started_cluster(zookeeper, tmp_path, 3, 1) as storage_cluster:
        yield storage_cluster


def test_a_replica_that_does_not_vote_does_not_resolve_the_mark_below_a_committed_record(
    cluster: StorageCluster, zookeeper: str
) -> None:
    holder, lagging, moved_back = cluster.nodes

    async def go() -> None:
        # The holder answers last: behind a proxy that refuses until the others have reported.
        proxy = await TcpProxy(holder.host, holder.port).start()
        proxy.refuse = True
        storages = [proxy.connect_string, *(node_connect_string(node) for node in (lagging, moved_back))]
        try:
            with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
                for name, node in zip(storages, cluster.nodes, strict=True):
                    register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
                await set_up_storage(holder, PARTITION_ID, PREVIOUS_SESSION_ID, MARK, COMMITTED_TXID)
                await set_up_storage(lagging, PARTITION_ID, PREVIOUS_SESSION_ID, MARK, LAGGING_TXID)
                # It held the committed records too, but its control file is a session behind ZK's.
                await set_up_storage(moved_back, PARTITION_ID, OLDER_SESSION_ID, MARK, COMMITTED_TXID)
                write_clean_metadata(
                    zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, storages
                )
                store = await open_store(zk, cluster.root)
                try:
                    partition, opened = await begin_open(store, PARTITION_ID, GENERATION)
                    # Truncated to its mark and caught up from the lagging voter: counted as a
                    # replica that never held more, the two resolved the mark here, and the holder's
                    # committed LAGGING_TXID + 1..COMMITTED_TXID were cut once it answered.
                    await wait_until_async(
                        lambda: holds_exactly(moved_back, PARTITION_ID, LAGGING_TXID),
                        "the moved-back replica caught up",
                    )
                    proxy.refuse = False
                    await bounded(opened)
                    await wait_until(lambda: caught_up(partition.status(), storages), "all caught up")
                    assert partition.high_water_mark == COMMITTED_TXID
                finally:
                    await store.close()
        finally:
            await proxy.close()
        for node in cluster.nodes:
            records = await read_all(node, PARTITION_ID, PREVIOUS_SESSION_ID + 1, COMMITTED_TXID + 1)
            assert records == make_records(0, COMMITTED_TXID + 1, PARTITION_ID)

    asyncio.run(go())
