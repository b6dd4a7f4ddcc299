"""A new session id waits for ZooKeeper's word off the connection's read loop.

A server sends every partition's requests to a storage node over one connection. While the
node asks ZooKeeper about one partition's new session id (up to its call timeout when ZooKeeper
is unreachable), the other partitions' appends on that connection used to wait behind it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from storage_node_support import (
    ISSUED_SESSION_ID,
    StorageNodeProcess,
    create_test_cluster,
    free_tcp_port,
    make_records,
)

from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk.server import EmbeddedZooKeeper


def test_a_session_check_does_not_hold_back_other_partitions(tmp_path: Path) -> None:
    zookeeper = EmbeddedZooKeeper(tmp_path / "zookeeper", free_tcp_port())
    zookeeper.start()
    try:
        root, key = create_test_cluster(zookeeper.connect_string, 2)
        node = StorageNodeProcess(zookeeper.connect_string, root, key, 2, tmp_path / "node", jetty=False)
        node.start()
    except BaseException:
        zookeeper.stop()
        raise
    try:
        node.assign()

        async def go() -> list[str]:
            client = node.data_client()
            await client.open()
            order: list[str] = []
            try:

                async def new_session() -> None:
                    try:
                        await client.last_session_info(ISSUED_SESSION_ID + 1, 0)
                    except StorageRpcError as e:
                        assert "cannot confirm a new session id of partition 0" in str(e), e
                    order.append("partition 0: new session answered")

                async def append() -> None:
                    # Session ids up to the issued one were confirmed before ZooKeeper stopped.
                    await client.append(ISSUED_SESSION_ID, 1, make_records(0, 3, 1))
                    order.append("partition 1: append answered")

                check = asyncio.create_task(new_session())
                await asyncio.sleep(0)  # the new session's frame goes out first
                await append()
                await check
            finally:
                await client.close()
            return order

        async def open_session_on_partition_1() -> None:
            client = node.data_client()
            await client.open()
            try:
                await client.last_session_info(ISSUED_SESSION_ID, 1)
            finally:
                await client.close()

        node.run(open_session_on_partition_1())  # confirmed while ZooKeeper answers
        zookeeper.stop()  # now the node cannot confirm partition 0's new session id
        assert node.run(go()) == ["partition 1: append answered", "partition 0: new session answered"]
    finally:
        node.close()
        zookeeper.stop()
