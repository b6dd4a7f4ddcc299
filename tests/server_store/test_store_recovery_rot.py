"""A recovery copying from a replica whose record is rotten copies it from another replica.

Issue 13: damage at or below a replica's durable point is kept on disk and refused on reads. A
lagging replica's catch-up used to re-raise that refusal, so the recovery aborted on every
retry and the partition could not open a session. Here two replicas each hold one rotten
record (a different one), and the third lags behind both: whichever replica the catch-up
starts from, it meets rot and must take that stretch from the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, flip_data_bits, make_records
from store_cluster_support import (
    StorageCluster,
    node_connect_string,
    read_all,
    recover_all,
    register,
    replica_state,
    set_up_storage,
    started_cluster,
    write_clean_metadata,
    write_metadata,
)

from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK

PARTITION_ID = 0
GENERATION = 3
PREVIOUS_SESSION_ID = ISSUED_SESSION_ID
LAST_TXID = 99
LAGGING_TXID = 49
ROTTEN = {0: 70, 1: 80}  # node index → the txid rotten on it (both below its low-water mark)


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with started_cluster(zookeeper, tmp_path, 3, 1) as storage_cluster:
        yield storage_cluster


async def _refused(node: StorageNodeProcess, txid: int) -> bool:
    try:
        await node.with_admin(lambda admin: admin.record_list(PARTITION_ID, txid, 1))
    except StorageRpcError as e:
        return "corrupt record" in str(e)
    return False


def test_catch_up_takes_a_rotten_record_from_another_replica(cluster: StorageCluster, zookeeper: str) -> None:
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
            for i, node in enumerate(cluster.nodes):
                last = LAGGING_TXID if i == 2 else LAST_TXID
                await set_up_storage(node, PARTITION_ID, PREVIOUS_SESSION_ID, last, last)
            for i, txid in ROTTEN.items():
                flip_data_bits(cluster.nodes[i].directory / str(PARTITION_ID), [txid])
                assert await _refused(cluster.nodes[i], txid)
            write_clean_metadata(zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, storages)
            assert await recover_all(zk, cluster.root, PARTITION_ID, GENERATION, storages) == LAST_TXID
        session_id = PREVIOUS_SESSION_ID + 1
        lagging = await read_all(cluster.nodes[2], PARTITION_ID, session_id, LAST_TXID + 1)
        assert lagging == make_records(0, LAST_TXID + 1, PARTITION_ID)

    asyncio.run(go())


def test_a_rotten_record_is_copied_from_a_replica_new_to_the_set(
    cluster: StorageCluster, zookeeper: str
) -> None:
    # The previous session's replicas: node 0 (rot in one record), node 1 (lagging) and one since
    # moved away (a decommission: absent for good). Node 2 took its place, whole up to its
    # low-water mark, but is new to the set. Until node 1 reaches node 0's mark the mark cannot be
    # resolved (the absent replica could hold it), and node 1 can take the rotten record only
    # from node 2: the recovery refused to copy from a replica new to the set and aborted on it in
    # every session, for good (issue 32: the simulator's seed 274). Its records up to its
    # low-water mark are committed ones, the same on every replica.
    storages = [node_connect_string(node) for node in cluster.nodes]
    moved_away = "127.0.0.1:1"  # only in the previous session's replica states
    rotten = 70
    lagging, whole = cluster.nodes[1], cluster.nodes[2]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
            await set_up_storage(cluster.nodes[0], PARTITION_ID, PREVIOUS_SESSION_ID, LAST_TXID, LAST_TXID)
            await set_up_storage(lagging, PARTITION_ID, PREVIOUS_SESSION_ID, LAGGING_TXID, LAGGING_TXID)
            await set_up_storage(whole, PARTITION_ID, PREVIOUS_SESSION_ID, LAST_TXID, LAST_TXID)
            flip_data_bits(cluster.nodes[0].directory / str(PARTITION_ID), [rotten])
            assert await _refused(cluster.nodes[0], rotten)
            states = [
                replica_state(PARTITION_ID, name, PREVIOUS_SESSION_ID, UNRESOLVED_HIGH_WATER_MARK)
                for name in (storages[0], storages[1], moved_away)
            ]
            write_metadata(zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, states)
            assert await recover_all(zk, cluster.root, PARTITION_ID, GENERATION, storages) == LAST_TXID
        caught = await read_all(lagging, PARTITION_ID, PREVIOUS_SESSION_ID + 1, LAST_TXID + 1)
        assert caught == make_records(0, LAST_TXID + 1, PARTITION_ID)

    asyncio.run(go())
