"""Issue 13 item 1 with real processes: a forged read cannot fence a partition.

One LAST_SESSION_INFO frame with session id 2^62, sent to one of three storage nodes by a
client that knows the cluster key, used to raise that node's session id for good: every later
store session failed there and its recovery aborted, so the partition became unwritable
("session id has changed to 5969061777675188992"). A read no longer moves the session id; and
a replica that refuses a new session (a forged *write* still fences it) is left out of the
recovery, which finishes with the quorum of the others.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config

from waltz_engine.client import WaltzClient
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.storage.client import StorageClient
from waltz_engine.zk.connection import connect
from waltz_engine.zk.store_metadata import read_store_params

COMMIT_TIMEOUT_S = 60.0
FORGED_SESSION_ID = 1 << 62
KEEP_ALL = (1 << 63) - 1  # TRUNCATE to Long.MAX_VALUE: removes nothing


async def _commit(client: WaltzClient, data: str) -> None:
    context = MockContext(data, partition=0)
    await client.submit(context)
    assert await context.result(COMMIT_TIMEOUT_S), f"{data!r} did not commit"


def _forge(port: int, key: Any, write: bool) -> None:
    async def go() -> None:
        rogue = StorageClient("127.0.0.1", port, client_context(TlsConfig()), key, 1)
        await rogue.open(10_000)
        try:
            if write:
                # A write moves the node's session id: that replica refuses every real session.
                await rogue.truncate(FORGED_SESSION_ID, 0, KEEP_ALL)
            else:
                # Answered (a read is harmless), but it no longer fences the real sessions out.
                info = await rogue.last_session_info(FORGED_SESSION_ID, 0)
                assert info.session_id < FORGED_SESSION_ID
        finally:
            await rogue.close()

    asyncio.run(go())


@pytest.mark.parametrize("forged_request", ["last-session-info", "truncate"])
def test_a_forged_session_on_one_replica_leaves_the_partition_writable(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, forged_request: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as cluster:
        with connect(cluster.zookeeper_settings()) as zk:
            key = read_store_params(zk, cluster.cluster_root).key

        async def writes(first: int, count: int) -> None:
            callbacks = MockCallbacks()
            async with WaltzClient(callbacks, waltz_client_config(cluster)) as client:
                for i in range(count):
                    await _commit(client, f"txn {first + i}")
                await callbacks.wait_for_high_water_mark(0, first + count - 1, COMMIT_TIMEOUT_S)

        asyncio.run(writes(0, 1))
        _forge(cluster.storages[1].port, key, write=forged_request == "truncate")
        # The running session: every batch needs the forged replica's vote or it rolls to a new
        # session (a new recovery), which the forged session id used to abort for good.
        asyncio.run(writes(1, 3))
        # A new server process: a new store session and a new recovery on every replica.
        cluster.servers[0].restart()
        asyncio.run(writes(4, 3))
        for node in cluster.servers + cluster.storages:
            assert node.stop(), f"{node.name} did not stop"
