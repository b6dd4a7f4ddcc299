"""Issue 13 item 3 with real processes: a rotten record below the low-water mark is never served.

A bit flipped in a committed record's data on a storage node (below its local low-water mark,
so start-up recovery does not look at it) used to be read and sent as it was: the server handed
the rotten bytes to the client. Now the node checks every record it sends and answers a bad one
with a FAILURE naming it; the server reads that record from another replica, and the client
gets the bytes that were committed. Each of the three replicas has rot in a different range, so
whichever replica the server reads a stretch from, it meets rot there.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config
from storage_node_support import flip_data_bits

from waltz_engine.client import WaltzClient
from waltz_engine.common.address import HostPort
from waltz_engine.disk.control_reader import read_control_file
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.devcluster.nodes import LocalNode
from waltz_engine.storage.admin_ops import StorageAdminError, StorageContext, admin_client, max_transaction_id
from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.zk.connection import connect
from waltz_engine.zk.store_metadata import read_partition_metadata, read_store_params

COMMIT_TIMEOUT_S = 60.0
TRANSACTIONS = 30
# Rotten on each node in turn; every record is whole on the two other nodes.
ROTTEN = (range(2, 8), range(8, 14), range(14, 20))


def _data(txid: int) -> str:
    return f"transaction {txid:03d}: committed bytes"


async def _wait_max_transaction_id(node: LocalNode, context: StorageContext, txid: int) -> None:
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    address = HostPort("127.0.0.1", node.admin_port)
    seen = -1
    while seen < txid:
        try:
            seen = await max_transaction_id(context, address, node.port, 0, offline=False)
        except StorageAdminError as e:
            # The server's recovery may open session after session while the node catches up:
            # the question is asked again (the admin op retries only a few changes itself).
            if "session id" not in str(e):
                raise
        assert time.monotonic() < deadline, f"the restarted node is stuck at {seen}, expected {txid}"
        if seen < txid:
            await asyncio.sleep(0.2)


async def _wait_low_water_mark(node: LocalNode, context: StorageContext, txid: int) -> None:
    """Until a store session of the server has set ``node``'s low-water mark to ``txid`` or more:
    a server is "ready" when it serves, its partition's store session opens (and reaches each
    replica) after that."""
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    address = HostPort("127.0.0.1", node.admin_port)
    while True:
        async with admin_client(context, address) as admin:
            info = await admin.last_session_info(0)
        if info.low_water_mark >= txid:
            return
        assert time.monotonic() < deadline, f"the node's low-water mark is stuck: {info}"
        await asyncio.sleep(0.2)


async def _refused(node: LocalNode, context: StorageContext, txid: int) -> bool:
    async with admin_client(context, HostPort("127.0.0.1", node.admin_port)) as admin:
        try:
            await admin.record_list(0, txid, 1)
        except StorageRpcError as e:
            return "corrupt record" in str(e)
    return False


def test_a_rotten_record_is_read_from_another_replica_and_never_served(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as cluster:
        with connect(cluster.zookeeper_settings()) as zk:
            key = read_store_params(zk, cluster.cluster_root).key
        server, rotten_node = cluster.servers[0], cluster.storages[0]

        async def append(first: int, count: int) -> None:
            # No data asked ahead: the server's cache must not hold the records before the flips,
            # or the reads below would be served from it and never reach a replica.
            config = waltz_client_config(cluster, data_prefetch_bytes=0)
            async with WaltzClient(MockCallbacks(), config) as client:
                for txid in range(first, first + count):
                    context = MockContext(_data(txid), partition=0)
                    await client.submit(context)
                    assert await context.result(COMMIT_TIMEOUT_S), f"transaction {txid} did not commit"

        storage_context = StorageContext(key, 1, client_context(TlsConfig()))
        asyncio.run(append(0, TRANSACTIONS))
        # A new server process: a new store session raises every replica's low-water mark to the
        # high-water mark, and the server's transaction cache starts empty.
        server.restart()
        last = TRANSACTIONS - 1
        for node, rotten in zip(cluster.storages, ROTTEN, strict=True):
            asyncio.run(_wait_low_water_mark(node, storage_context, TRANSACTIONS - 1))
            assert node.stop()
            data_dir = node.directory / "data"
            local_lwm = read_control_file(data_dir).partitions[0].current
            assert local_lwm is not None and local_lwm.local_low_water_mark >= rotten[-1], local_lwm
            flip_data_bits(data_dir / "0", rotten)
            node.start()
            # One more transaction, and the node back in the session with it (so it is asked).
            last += 1
            asyncio.run(append(last, 1))
            asyncio.run(_wait_max_transaction_id(node, storage_context, last))

        async def read_through_client() -> list[object]:
            callbacks = MockCallbacks(fetch_data=True)
            async with WaltzClient(callbacks, waltz_client_config(cluster)) as client:
                assert client is not None
                await callbacks.wait_for_high_water_mark(0, last, COMMIT_TIMEOUT_S)
            return callbacks.data

        fetched = asyncio.run(read_through_client())
        assert fetched == [_data(t) for t in range(last + 1)]
        # Every replica holds rot that the client never saw: a read of a stretch ends before a
        # replica's rotten record (a short answer), or is refused there and read elsewhere.
        for node, rotten in zip(cluster.storages, ROTTEN, strict=True):
            assert asyncio.run(_refused(node, storage_context, rotten[0])), f"{node.name} served rot"

        with connect(cluster.zookeeper_settings()) as zk:
            session_id = read_partition_metadata(zk, cluster.cluster_root, 0).metadata.session_id

        async def direct_record_request(txid: int) -> str:
            storage = StorageClient("127.0.0.1", rotten_node.port, client_context(TlsConfig()), key, 1)
            await storage.open(10_000)
            try:
                record = await storage.record(session_id, 0, txid)
            except StorageRpcError as e:
                return str(e)
            finally:
                await storage.close()
            raise AssertionError(f"the node served transaction {txid}: {record!r}")

        message = asyncio.run(direct_record_request(ROTTEN[0][0]))
        assert f"partition 0 transaction {ROTTEN[0][0]}" in message, message
        assert "corrupt record" in message, message
        # The node stays up and serves its good records.
        assert rotten_node.is_running()
