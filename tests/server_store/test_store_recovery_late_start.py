"""A recovery truncating a replica whose log begins above its mark empties it and fills it again.

A replica filled from the others' retained start is first emptied, then begins its log late at
the retained start (``PartitionWorker._start_late``); its control file keeps the low-water mark
of its last session until a session sets a new one. When the session filling it ends before that
(a full disk refused the fill: the simulator's seed 236 of issue 32), the next recovery finds its
storage session older than ZooKeeper's and truncates it to that old mark, below where its log
now begins. The node refuses (a truncate there would leave a gap), and every store session
failed on it for good: the partition never opened again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, make_records
from store_cluster_support import (
    StorageCluster,
    node_connect_string,
    read_all,
    recover_all,
    register,
    set_up_storage,
    started_cluster,
    write_clean_metadata,
)

from waltz_engine.zk.connection import ZooKeeperSettings, connect

PARTITION_ID = 0
GENERATION = 3
PREVIOUS_SESSION_ID = ISSUED_SESSION_ID
OLD_SESSION_ID = PREVIOUS_SESSION_ID - 1  # the late replica's control file: a session behind ZK's
LAST_TXID = 20
OLD_MARK = 2  # the late replica's low-water mark in its control file
LATE_START = 8  # where its log begins now (the others' retained start, when it was filled)
RETENTION_BOUND = LATE_START + 1  # lets an empty log begin at LATE_START


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with started_cluster(zookeeper, tmp_path, 3, 1, {PARTITION_ID: RETENTION_BOUND}) as storage_cluster:
        yield storage_cluster


def test_a_replica_whose_log_begins_above_its_mark_is_emptied_and_filled(
    cluster: StorageCluster, zookeeper: str
) -> None:
    storages = [node_connect_string(node) for node in cluster.nodes]
    late = cluster.nodes[0]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
            for node in cluster.nodes[1:]:
                await set_up_storage(node, PARTITION_ID, PREVIOUS_SESSION_ID, LAST_TXID, LAST_TXID)
            # The late replica: records up to its mark, emptied and begun again at LATE_START.
            await set_up_storage(late, PARTITION_ID, OLD_SESSION_ID, OLD_MARK, OLD_MARK)
            client = late.data_client()
            await client.open()
            try:
                assert await client.truncate(OLD_SESSION_ID, PARTITION_ID, -1) == -1
                await client.append(OLD_SESSION_ID, PARTITION_ID, make_records(LATE_START, 3, PARTITION_ID))
            finally:
                await client.close()
            write_clean_metadata(zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, storages)
            assert await recover_all(zk, cluster.root, PARTITION_ID, GENERATION, storages) == LAST_TXID
        # Emptied, it was filled from 0 (the others hold the whole log): no gap, every record.
        filled = await read_all(late, PARTITION_ID, PREVIOUS_SESSION_ID + 1, LAST_TXID + 1)
        assert filled == make_records(0, LAST_TXID + 1, PARTITION_ID)

    asyncio.run(go())
