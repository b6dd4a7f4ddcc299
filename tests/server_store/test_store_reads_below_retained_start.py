"""Reads below the retained start, with real storage nodes and ZooKeeper (issue 32).

A read of a transaction that retention removed can never succeed: the store partition used to
retry it without end, and whatever waited on it (a feed worker serving every feed of the
partition, a new session deciding its predecessor's appends) stalled the partition for good
(the simulator's seeds 1558, 2056 and bank seeds 214, 218, 498, 906). Now the store asks every
replica, serves the read from one that still holds the record, and otherwise raises
``RetainedStartError`` at once, naming the retained start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, make_records
from store_cluster_support import (
    StorageCluster,
    bounded,
    node_connect_string,
    open_store,
    register,
    set_up_storage,
    started_cluster,
    write_clean_metadata,
)
from store_cluster_support import begin_late as store_begin_late

from waltz_engine.server.store.errors import RetainedStartError
from waltz_engine.zk.connection import ZooKeeperSettings, connect

REMOVED = 0  # partition whose every replica begins its log at LATE_START
ONE_KEEPS = 1  # partition whose first replica still holds the whole log
GENERATION = 3
SESSION_ID = ISSUED_SESSION_ID
LAST_TXID = 20
LATE_START = 8
RETENTION_BOUND = LATE_START + 1  # lets an empty log begin at LATE_START
# A read that is refused must be refused well within this (it was retried for good).
ANSWER_TIMEOUT_S = 20.0


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    bounds = {REMOVED: RETENTION_BOUND, ONE_KEEPS: RETENTION_BOUND}
    with started_cluster(zookeeper, tmp_path, 3, 2, bounds) as storage_cluster:
        yield storage_cluster


async def begin_late(node: StorageNodeProcess, partition_id: int) -> None:
    """The replica holds LATE_START..LAST_TXID only, as after retention removed its head."""
    await store_begin_late(node, partition_id, SESSION_ID, LATE_START, LAST_TXID)


def test_a_read_below_the_retained_start_is_answered_not_retried(
    cluster: StorageCluster, zookeeper: str
) -> None:
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [REMOVED, ONE_KEEPS])
            for node in cluster.nodes:
                await begin_late(node, REMOVED)
            await set_up_storage(cluster.nodes[0], ONE_KEEPS, SESSION_ID, LAST_TXID, LAST_TXID)
            for node in cluster.nodes[1:]:
                await begin_late(node, ONE_KEEPS)
            for partition_id in (REMOVED, ONE_KEEPS):
                write_clean_metadata(zk, cluster.root, partition_id, GENERATION, SESSION_ID, storages)
            store = await open_store(zk, cluster.root)
            try:
                removed = store.partition(REMOVED)
                await removed.set_generation(GENERATION)
                await bounded(removed.ensure_open())
                assert removed.high_water_mark == LAST_TXID
                for read in (removed.record_headers(3, 5), removed.committed_records(3, 5)):
                    with pytest.raises(RetainedStartError) as refused:
                        await asyncio.wait_for(read, ANSWER_TIMEOUT_S)
                    assert refused.value.retained_start == LATE_START
                headers = await bounded(removed.record_headers(LATE_START, 3))
                assert [h.transaction_id for h in headers] == [LATE_START, LATE_START + 1, LATE_START + 2]

                # A replica whose cleaner has not removed the head yet still serves it, whichever
                # replica the read asks first.
                keeps = store.partition(ONE_KEEPS)
                await keeps.set_generation(GENERATION)
                await bounded(keeps.ensure_open())
                for _ in range(5):
                    records = await asyncio.wait_for(keeps.committed_records(3, 2), ANSWER_TIMEOUT_S)
                    assert records == make_records(3, 2, ONE_KEEPS)
            finally:
                await store.close()

    asyncio.run(go())
