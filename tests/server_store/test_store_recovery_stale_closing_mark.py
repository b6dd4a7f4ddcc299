"""A recovery never cuts a replica below its own low-water mark for a stale recorded closing mark.

A store session's recovery sets each replica's low-water mark before it records the replicas in
ZooKeeper. When that write fails (ZooKeeper away, the session deposed), ZooKeeper keeps the
replica's older state: its session and the closing mark of then, below the low-water mark the
replica now holds. The next recovery cut the replica to that recorded mark, removing records it
held committed; where its head was in the tier the node refused the cut, in every session, and
the partition stalled for good (issue 32: the simulator's seed 40057). Here the replica's head
was removed by retention, so the cut emptied it to be filled again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess
from store_cluster_support import (
    StorageCluster,
    begin_late,
    node_connect_string,
    recover_all,
    register,
    replica_state,
    set_up_storage,
    started_cluster,
    write_metadata,
)

from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK

PARTITION_ID = 0
GENERATION = 3
SESSION_ID = ISSUED_SESSION_ID  # the session whose recovery set the marks, then failed to record them
RECORDED_SESSION_ID = SESSION_ID - 1  # what ZooKeeper still says of the first replica
RECORDED_CLOSING_MARK = 5  # below the first replica's low-water mark
LAST_TXID = 20
LATE_START = 8  # where the first replica's log begins (retention removed its head)
RETENTION_BOUND = LATE_START + 1


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with started_cluster(zookeeper, tmp_path, 3, 1, {PARTITION_ID: RETENTION_BOUND}) as storage_cluster:
        yield storage_cluster


async def _records_from(node: StorageNodeProcess, first: int) -> list[int]:
    client = node.data_client()
    await client.open()
    try:
        records = await client.records(SESSION_ID + 1, PARTITION_ID, first, LAST_TXID + 1)
        return [record.transaction_id for record in records]
    finally:
        await client.close()


def test_a_stale_recorded_closing_mark_does_not_cut_below_the_replicas_low_water_mark(
    cluster: StorageCluster, zookeeper: str, caplog: pytest.LogCaptureFixture
) -> None:
    storages = [node_connect_string(node) for node in cluster.nodes]
    first = cluster.nodes[0]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
            for node in cluster.nodes[1:]:
                await set_up_storage(node, PARTITION_ID, SESSION_ID, LAST_TXID, LAST_TXID)
            await begin_late(first, PARTITION_ID, SESSION_ID, LATE_START, LAST_TXID)
            states = [
                replica_state(PARTITION_ID, storages[0], RECORDED_SESSION_ID, RECORDED_CLOSING_MARK),
                *(
                    replica_state(PARTITION_ID, s, SESSION_ID, UNRESOLVED_HIGH_WATER_MARK)
                    for s in storages[1:]
                ),
            ]
            write_metadata(zk, cluster.root, PARTITION_ID, GENERATION, SESSION_ID, states)
            with caplog.at_level(logging.WARNING, logger="waltz_engine.server.store.recovery"):
                assert await recover_all(zk, cluster.root, PARTITION_ID, GENERATION, storages) == LAST_TXID
        # Kept as it was: not emptied (cut to 5) and filled again from 0.
        assert "emptying it" not in caplog.text
        assert await _records_from(first, LATE_START) == list(range(LATE_START, LAST_TXID + 1))

    asyncio.run(go())
