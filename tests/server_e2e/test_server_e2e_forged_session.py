"""Issue 13 item 1 with real processes: a forged session id cannot fence a replica.

One LAST_SESSION_INFO frame with session id 2^62, sent to one of three storage nodes by a
client that knows the cluster key, used to raise that node's session id for good: every later
store session failed there and its recovery aborted, so the partition became unwritable
("session id has changed to 5969061777675188992"). Now a request moves a node's session id
only up to what ZooKeeper's store session has issued (and a read never moves it): the forged
frame is refused, the replica stays in every session, and the partition stays writable.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config

from waltz_engine.client import WaltzClient
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import read_partition_metadata, read_store_params

COMMIT_TIMEOUT_S = 60.0
FORGED_SESSION_ID = 1 << 62
KEEP_ALL = (1 << 63) - 1  # TRUNCATE to Long.MAX_VALUE: removes nothing
TRANSACTIONS = 7


async def _commit(client: WaltzClient, data: str) -> None:
    context = MockContext(data, partition=0)
    await client.submit(context)
    assert await context.result(COMMIT_TIMEOUT_S), f"{data!r} did not commit"


def _store_session(settings: ZooKeeperSettings) -> int:
    with connect(settings) as zk:
        return read_partition_metadata(zk, settings.cluster_root, 0).metadata.session_id


async def _rogue(port: int, key: uuid.UUID) -> StorageClient:
    rogue = StorageClient("127.0.0.1", port, client_context(TlsConfig()), key, 1)
    await rogue.open(10_000)
    return rogue


def _forge(port: int, key: uuid.UUID, request: str) -> str:
    """Send one forged request; returns the node's refusal."""

    async def go() -> str:
        rogue = await _rogue(port, key)
        try:
            if request == "truncate":
                await rogue.truncate(FORGED_SESSION_ID, 0, KEEP_ALL)
            elif request == "last-session-info":
                await rogue.last_session_info(FORGED_SESSION_ID, 0)
            else:
                await rogue.max_transaction_id(FORGED_SESSION_ID, 0)
        except StorageRpcError as e:
            return str(e)
        finally:
            await rogue.close()
        raise AssertionError(f"a forged {request} was served")

    return asyncio.run(go())


def _max_transaction_ids(ports: list[int], key: uuid.UUID, session_id: int) -> list[int]:
    """Each replica's max txid, asked with the store session: fails on a fenced replica."""

    async def go() -> list[int]:
        found = []
        for port in ports:
            rogue = await _rogue(port, key)
            try:
                found.append(await rogue.max_transaction_id(session_id, 0))
            finally:
                await rogue.close()
        return found

    return asyncio.run(go())


@pytest.mark.parametrize("forged_request", ["last-session-info", "truncate", "max-transaction-id"])
def test_a_forged_session_id_is_refused_and_the_partition_stays_writable(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, forged_request: str
) -> None:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as cluster:
        settings = cluster.zookeeper_settings()
        with connect(settings) as zk:
            key = read_store_params(zk, cluster.cluster_root).key
        ports = [storage.port for storage in cluster.storages]

        async def writes(first: int, count: int) -> None:
            callbacks = MockCallbacks()
            async with WaltzClient(callbacks, waltz_client_config(cluster)) as client:
                for i in range(count):
                    await _commit(client, f"txn {first + i}")
                await callbacks.wait_for_high_water_mark(0, first + count - 1, COMMIT_TIMEOUT_S)

        asyncio.run(writes(0, 1))
        refusal = _forge(ports[1], key, forged_request)
        if forged_request == "max-transaction-id":
            assert "a read does not move it" in refusal, refusal
        else:
            assert f"session id {FORGED_SESSION_ID} of partition 0 was never issued" in refusal, refusal
        # Not fenced: the forged node still answers the real session.
        session_id = _store_session(settings)
        assert _max_transaction_ids(ports, key, session_id) == [0, 0, 0]
        asyncio.run(writes(1, 3))
        # A new server process: a new store session and a new recovery on every replica.
        cluster.servers[0].restart()
        asyncio.run(writes(4, 3))
        # No replica was left out of a session: each holds every transaction.
        later_session_id = _store_session(settings)
        assert later_session_id > session_id
        assert _max_transaction_ids(ports, key, later_session_id) == [TRANSACTIONS - 1] * 3
        assert refusal.split(": ", 1)[-1] in cluster.storages[1].log_text()
        for node in cluster.servers + cluster.storages:
            assert node.stop(), f"{node.name} did not stop"
