"""Issue 13 item 7: a storage node that refuses the server's cluster key is named at once.

A node of another cluster registered by mistake refuses every OPEN ("cluster key is
inconsistent"). The server used to log it only once its reconnect backoff reached the cap
(17 s of silence with the defaults); the first refusal is now a warning, and the partition
writes with the quorum of the other two replicas meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from pathlib import Path

import pytest
from storage_node_support import StorageNodeProcess, create_test_cluster
from store_cluster_support import StorageCluster, bounded, node_connect_string, open_store, register

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.store import StoreConfig
from waltz_engine.zk.connection import ZooKeeperSettings, connect

NUM_PARTITIONS = 1
# A long backoff cap: the old code would have stayed silent for about a minute.
SLOW_BACKOFF = StoreConfig(initial_retry_interval_ms=20, max_retry_interval_ms=60_000)
WARNING_TIMEOUT_S = 10.0


def test_first_cluster_key_refusal_is_a_warning(
    zookeeper: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = StorageCluster(zookeeper, tmp_path / "a", 2, NUM_PARTITIONS).start()
    other_root, other_key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    stranger = StorageNodeProcess(
        zookeeper, other_root, other_key, NUM_PARTITIONS, tmp_path / "b", jetty=False
    )
    stranger.start()
    stranger.assign()
    caplog.set_level(logging.WARNING, logger="waltz_engine.server.store")

    async def go() -> None:
        with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
            for node in (*cluster.nodes, stranger):
                register(zk, cluster.root, node_connect_string(node), node.admin_port, [0])
            store = await open_store(zk, cluster.root, SLOW_BACKOFF)
            try:
                partition = store.partition(0)
                await partition.set_generation(1)
                data = b"written by a quorum of two"
                future = await partition.append(ReqId(7, 1, 0, 1), 0, data, to_signed32(zlib.crc32(data)))
                assert await bounded(future) == 0
                refusal = f"cannot connect to {node_connect_string(stranger)}"
                for _ in range(int(WARNING_TIMEOUT_S / 0.05)):
                    if any(refusal in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.05)
                warnings = [r.getMessage() for r in caplog.records if refusal in r.getMessage()]
                assert warnings, "the refusing node was not named"
                assert "inconsistent" in warnings[0], warnings[0]
                # Limited: one line per node per interval, however many retries.
                assert len(warnings) == 1, warnings
            finally:
                await store.close()

    try:
        asyncio.run(go())
    finally:
        stranger.close()
        cluster.close()
