"""A recovery never cuts a replica below the low-water mark its disk took in a session that
ZooKeeper does not record for it.

A replica back late in a session is truncated, caught up and given that session's low-water mark;
when the session ends before it writes the replica's new state to ZooKeeper (the server paused past
its ZooKeeper session: the simulator's seed 313 of issue 32), ZooKeeper still holds the replica's
older session with its closing mark, below that low-water mark. The next recovery truncated it to
that closing mark. Its records up to the low-water mark are committed; the node had offloaded its
head to the tier (which acts below the low-water mark) and refused a truncate there, and every store
session failed on it, for good: the replica never caught up again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, make_records
from store_cluster_support import (
    StorageCluster,
    metadata,
    node_connect_string,
    read_all,
    recover_all,
    register,
    replica_state,
    set_up_storage,
    wait_until,
    write_metadata,
)

from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK

PARTITION_ID = 0
GENERATION = 3
PREVIOUS_SESSION_ID = ISSUED_SESSION_ID
LAST_TXID = 45  # what the others hold, voting
# The late replica: its disk took PREVIOUS_SESSION_ID's low-water mark, ZooKeeper still has it in
# an older session with a closing mark below that.
LATE_MARK = 39
ZK_SESSION_ID = PREVIOUS_SESSION_ID - 1
ZK_CLOSING_MARK = 5
# Segments of 10 records (make_records' 32 data bytes), all the tier may evict: the late replica
# keeps its segments from 20 on, its head only in the tier.
PER_SEGMENT = 10
DATA_BYTES = 32
THRESHOLD_BYTES = HEADER_SIZE_BYTES + (PER_SEGMENT - 1) * (RECORD_OVERHEAD_BYTES + DATA_BYTES)
TIER_CONFIG: dict[str, Any] = {
    "storage.segment.size.threshold": THRESHOLD_BYTES,
    "storage.tier.local.bytes": 1,
    "storage.tier.check.interval.ms": 50,
}
LOCAL_AFTER_EVICTION = [f"{first:019d}.seg" for first in (20, 30)]


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    storage_cluster = StorageCluster(zookeeper, tmp_path, 2, 1)
    config = dict(TIER_CONFIG, **{"storage.tier.url": (tmp_path / "tier").as_uri()})
    storage_cluster.nodes.append(
        StorageNodeProcess(
            zookeeper,
            storage_cluster.root,
            storage_cluster.key,
            1,
            tmp_path / "late",
            jetty=False,
            extra_config=config,
        )
    )
    storage_cluster.start()
    try:
        yield storage_cluster
    finally:
        storage_cluster.close()


def local_segments(node: StorageNodeProcess) -> list[str]:
    return sorted(p.name for p in (node.directory / str(PARTITION_ID)).glob("*.seg"))


def test_a_replica_is_not_cut_below_the_low_water_mark_of_a_session_zookeeper_missed(
    cluster: StorageCluster, zookeeper: str
) -> None:
    storages = [node_connect_string(node) for node in cluster.nodes]
    late = cluster.nodes[-1]

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for name, node in zip(storages, cluster.nodes, strict=True):
                register(zk, cluster.root, name, node.admin_port, [PARTITION_ID])
            for node in cluster.nodes[:-1]:
                await set_up_storage(node, PARTITION_ID, PREVIOUS_SESSION_ID, LAST_TXID, LAST_TXID)
            await set_up_storage(late, PARTITION_ID, PREVIOUS_SESSION_ID, LATE_MARK, LATE_MARK)
            await wait_until(lambda: local_segments(late) == LOCAL_AFTER_EVICTION, "the late head evicted")
            states = [
                replica_state(PARTITION_ID, storages[0], PREVIOUS_SESSION_ID, UNRESOLVED_HIGH_WATER_MARK),
                replica_state(PARTITION_ID, storages[1], PREVIOUS_SESSION_ID, UNRESOLVED_HIGH_WATER_MARK),
                replica_state(PARTITION_ID, storages[2], ZK_SESSION_ID, ZK_CLOSING_MARK),
            ]
            write_metadata(zk, cluster.root, PARTITION_ID, GENERATION, PREVIOUS_SESSION_ID, states)
            assert await recover_all(zk, cluster.root, PARTITION_ID, GENERATION, storages) == LAST_TXID
            # Recorded clean in the new session.
            (recorded,) = [
                s
                for s in metadata(zk, cluster.root, PARTITION_ID).replica_states
                if s.replica_id.storage == storages[2]
            ]
            assert (recorded.session_id, recorded.is_unresolved) == (PREVIOUS_SESSION_ID + 1, True)
        # Kept up to its mark (its head still only in the tier, never emptied and filled from 0),
        # caught up past it: every record.
        assert local_segments(late)[0] >= LOCAL_AFTER_EVICTION[0]
        held = await read_all(late, PARTITION_ID, PREVIOUS_SESSION_ID + 1, LAST_TXID + 1)
        assert held == make_records(0, LAST_TXID + 1, PARTITION_ID)

    asyncio.run(go())
    assert "StorageTruncateRequest failed" not in late.log_text()
