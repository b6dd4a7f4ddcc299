"""A replica whose session id was reset refuses a deposed writer (issue 32: the simulator's seed 1156).

Unassigning a partition resets its replica's session id to -1, as the original does. A move back
onto the node copies the committed records to it (offline, with that reset session id) and puts
it online. The deposed store session's appends, held up in the network since before the reset,
then moved the session id to their dead session (ZooKeeper had issued it, once) and were written
after the copied records, where the next session's recovery took them for committed. Now such a
replica moves its session id only to ZooKeeper's latest session: after the reset while the node
runs, and after a restart too (it holds records no session set a low-water mark for).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, create_test_cluster, make_records

from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import issue_store_sessions

PARTITION = 0
DEPOSED_SESSION_ID = ISSUED_SESSION_ID
LATEST_SESSION_ID = ISSUED_SESSION_ID + 1
COPIED = 4  # records 0..3: committed, the move's copy brings them back
RESET_SESSION_ID = -1  # the unassigned replica's session id, which the move's copy writes with
SUPERSEDED = (
    f"ConcurrentUpdateException: session id {DEPOSED_SESSION_ID} of partition {PARTITION} was superseded"
)


async def _opened(node: StorageNodeProcess, offline: bool = False) -> StorageClient:
    client = node.data_client(used_by_offline_recovery=offline)
    await client.open()
    return client


def _issue(zookeeper: str, root: str, session_id: int) -> None:
    """A new server's compare-and-set of the partition's store session."""
    with connect(ZooKeeperSettings(zookeeper, root)) as zk:
        issue_store_sessions(zk, root, 1, session_id)


async def _moved_away_and_back(node: StorageNodeProcess, zookeeper: str, root: str) -> None:
    """The replica leaves (files kept), a newer session is issued, and a move copies it back."""
    records = make_records(0, COPIED)
    await node.with_admin(lambda admin: admin.set_partition_assignment([PARTITION], False, False))
    await asyncio.to_thread(_issue, zookeeper, root, LATEST_SESSION_ID)
    await node.with_admin(lambda admin: admin.set_partition_assignment([PARTITION], True, False))
    await node.with_admin(lambda admin: admin.set_partition_available([PARTITION], False))
    copy = await _opened(node, offline=True)
    try:
        assert await copy.last_session_info(RESET_SESSION_ID, PARTITION) == (RESET_SESSION_ID, -1, -1)
        assert await copy.truncate(RESET_SESSION_ID, PARTITION, -1) == -1
        await copy.append(RESET_SESSION_ID, PARTITION, records)
        await copy.set_low_water_mark(RESET_SESSION_ID, PARTITION, COPIED - 1)
    finally:
        await copy.close()
    await node.with_admin(lambda admin: admin.set_partition_available([PARTITION], True))


def test_a_replica_moved_away_and_back_refuses_the_deposed_session(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, 1)  # ZooKeeper's store session: DEPOSED_SESSION_ID
    node = StorageNodeProcess(zookeeper, root, key, 1, tmp_path / "node", jetty=False)
    node.start()
    records = make_records(0, COPIED + 2)
    try:
        node.assign()

        async def reset_while_running() -> int:
            deposed = await _opened(node)  # its connection outlives the reset, as in the seed
            try:
                assert await deposed.last_session_info(DEPOSED_SESSION_ID, PARTITION) == (-1, -1, -1)
                await deposed.set_low_water_mark(DEPOSED_SESSION_ID, PARTITION, -1)
                await deposed.append(DEPOSED_SESSION_ID, PARTITION, records[:COPIED])
                await _moved_away_and_back(node, zookeeper, root)
                # Held up since before the reset: refused, not written after the copied records.
                with pytest.raises(StorageRpcError, match=SUPERSEDED):
                    await deposed.append(DEPOSED_SESSION_ID, PARTITION, records[COPIED:])
                with pytest.raises(StorageRpcError, match=SUPERSEDED):
                    await deposed.last_session_info(DEPOSED_SESSION_ID, PARTITION)
            finally:
                await deposed.close()
            reader = await _opened(node, offline=False)
            try:
                return await reader.max_transaction_id(RESET_SESSION_ID, PARTITION)
            finally:
                await reader.close()

        assert node.run(reset_while_running()) == COPIED - 1
        node.restart()

        async def after_restart() -> list[int]:
            client = await _opened(node)
            try:
                # The reset is forgotten with the process; the copied records without a session's
                # low-water mark still mark the replica.
                with pytest.raises(StorageRpcError, match=SUPERSEDED):
                    await client.append(DEPOSED_SESSION_ID, PARTITION, records[COPIED:])
                # The latest session recovers it and writes on.
                info = await client.last_session_info(LATEST_SESSION_ID, PARTITION)
                assert info == (RESET_SESSION_ID, COPIED - 1, COPIED - 1)
                await client.set_low_water_mark(LATEST_SESSION_ID, PARTITION, COPIED - 1)
                await client.append(LATEST_SESSION_ID, PARTITION, records[COPIED:])
                stored = await client.records(LATEST_SESSION_ID, PARTITION, 0, len(records) + 1)
                return [record.transaction_id for record in stored]
            finally:
                await client.close()

        assert node.run(after_restart()) == list(range(len(records)))
    finally:
        node.close()
