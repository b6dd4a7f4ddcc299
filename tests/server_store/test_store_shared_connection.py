"""The server's connection to a storage node, shared by every partition: a request to an idle
node leaves at once; the ones sent behind it in the same event loop turn leave in one write at
its end, each still a frame of its own (a real storage node answers every one of them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from storage_node_support import ISSUED_SESSION_ID, client_ssl, make_records
from store_cluster_support import StorageCluster, bounded, node_connect_string

from waltz_engine.net.channel import JOIN_LIMIT_BYTES
from waltz_engine.server.store.replica_connection import ReplicaConnection, StorageConnections
from waltz_engine.storage.client import DEFAULT_REQUEST_TIMEOUT_MS, encode_append_records

NUM_PARTITIONS = 8
RECORDS_PER_APPEND = 3
SMALL_RECORD_SIZE_BYTES = 64
# Two APPENDs of three records of this size (at most) fit one TLS record, three do not.
LARGE_RECORD_SIZE_BYTES = JOIN_LIMIT_BYTES // 6


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageCluster]:
    storage_cluster = StorageCluster(zookeeper, tmp_path_factory.mktemp("shared"), 1, NUM_PARTITIONS)
    storage_cluster.start()
    try:
        yield storage_cluster
    finally:
        storage_cluster.close()


async def _appends_in_one_turn(
    cluster: StorageCluster, partition_ids: range, record_size_bytes: int
) -> tuple[int, list[int]]:
    """A first APPEND to each partition, all issued in one loop turn: (the writes they took, the
    max txid of each partition on the node after)."""
    connections = StorageConnections(client_ssl(), cluster.key, NUM_PARTITIONS, DEFAULT_REQUEST_TIMEOUT_MS)
    try:
        client = await connections.get(node_connect_string(cluster.nodes[0]))
        replicas = [ReplicaConnection(client, p, ISSUED_SESSION_ID) for p in partition_ids]
        writes_before = client.writes  # type: ignore[attr-defined]
        appends = [
            replica.append(make_records(0, RECORDS_PER_APPEND, replica.partition_id, record_size_bytes))
            for replica in replicas
        ]
        await bounded(asyncio.gather(*appends))
        writes = client.writes - writes_before  # type: ignore[attr-defined]
        return writes, [await replica.max_transaction_id() for replica in replicas]
    finally:
        await connections.close()


def test_requests_of_many_partitions_behind_the_first_leave_in_one_write(cluster: StorageCluster) -> None:
    partition_ids = range(0, 4)
    writes, max_transaction_ids = asyncio.run(
        _appends_in_one_turn(cluster, partition_ids, SMALL_RECORD_SIZE_BYTES)
    )
    assert writes == 2  # the first at once, the three behind it together
    assert max_transaction_ids == [RECORDS_PER_APPEND - 1] * len(partition_ids)


def test_no_more_than_one_tls_record_waits(cluster: StorageCluster) -> None:
    partition_ids = range(4, 8)
    append_size_bytes = len(
        encode_append_records(make_records(0, RECORDS_PER_APPEND, 0, LARGE_RECORD_SIZE_BYTES))
    )
    assert JOIN_LIMIT_BYTES // 3 < append_size_bytes <= JOIN_LIMIT_BYTES // 2
    writes, max_transaction_ids = asyncio.run(
        _appends_in_one_turn(cluster, partition_ids, LARGE_RECORD_SIZE_BYTES)
    )
    assert writes == 3  # the first at once, then two APPENDs each
    assert max_transaction_ids == [RECORDS_PER_APPEND - 1] * len(partition_ids)
