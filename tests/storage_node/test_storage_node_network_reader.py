"""The network reader (waltz_engine.storage.network_reader) against a live 3-storage cluster:
it finds the replicas in ZooKeeper, reads over the admin port with RECORD_LIST_REQUEST, stays
under the committed bound, and finishes a slice exactly when a replica dies in the middle."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from cluster_support import TailRow, append_lines, local_cluster, tailed

from waltz_engine.common.config import Config
from waltz_engine.common.record import Record
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.storage.network_reader import (
    ClusterAccess,
    NetworkReadError,
    NetworkSlice,
    discover,
    read_slice_records,
)
from waltz_engine.zk.connection import ZooKeeperSettings

PARTITIONS = (0, 1)
ROWS = {0: 240, 1: 30}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory, storages=3, servers=1, partitions=len(PARTITIONS), zookeeper=zookeeper
    ) as c:
        append_lines(c, {p: [f"net-{p}-{i}" for i in range(n)] for p, n in ROWS.items()})
        yield c


@pytest.fixture(scope="module")
def access(cluster: LocalCluster) -> ClusterAccess:
    return ClusterAccess(ZooKeeperSettings.from_config(Config.load(cluster.client_config_path)))


def as_rows(partition_id: int, batches: Iterator[list[Record]]) -> list[TailRow]:
    return [
        (partition_id, r.transaction_id, *r.req_id[:2], r.req_id.seq_num, r.header, r.data.hex())
        for batch in batches
        for r in batch
    ]


def read_all(slices: list[NetworkSlice], **tuning: int) -> list[TailRow]:
    return [row for s in slices for row in as_rows(s.partition_id, read_slice_records(s, **tuning))]


def test_reads_every_committed_row_from_the_replicas_zookeeper_names(
    cluster: LocalCluster, access: ClusterAccess
) -> None:
    layout = discover(access)
    assert sorted(layout.partitions) == list(PARTITIONS)
    for p in PARTITIONS:
        sources = layout.partitions[p]
        assert sources.committed == ROWS[p] - 1
        assert len(sources.replicas) == 3
        assert {r.admin_port for r in sources.replicas} == {n.admin_port for n in cluster.storages}
    # Small slices and batches: many requests in flight, several slices, spread over replicas.
    slices = [s for p in PARTITIONS for s in layout.partitions[p].slices(0, 10**9, max_records=64)]
    assert len({s.replicas[0].storage for s in slices}) > 1
    assert read_all(slices, batch_records=7, in_flight=3) == tailed(cluster, PARTITIONS)


def test_never_reads_above_the_bound_and_an_empty_range_is_empty(access: ClusterAccess) -> None:
    layout = discover(access, partitions=[0], bounds={0: 99})
    sources = layout.partitions[0]
    assert sources.committed == 99
    rows = read_all(sources.slices(90, 10**9), batch_records=4)
    assert [t for _, t, *_ in rows] == list(range(90, 100))
    assert sources.slices(100, 10**9) == []
    with pytest.raises(NetworkReadError, match="Partition 7 does not belong to the cluster"):
        discover(access, partitions=[7])


def test_a_replica_that_fails_is_left_for_the_next(access: ClusterAccess) -> None:
    [part] = discover(access, partitions=[1]).partitions[1].slices(0, 10**9)
    dead = replace(part.replicas[0], storage="dead:1", admin_port=1)
    rows = read_all([replace(part, replicas=(dead, *part.replicas))])
    assert [t for _, t, *_ in rows] == list(range(ROWS[1]))
    with pytest.raises(NetworkReadError, match="could not be read from any replica"):
        read_all([replace(part, replicas=(dead,))])


def test_a_storage_node_killed_mid_slice_loses_and_repeats_nothing(
    cluster: LocalCluster, access: ClusterAccess
) -> None:
    expected = [row for row in tailed(cluster, [0])]
    [part] = discover(access, partitions=[0]).partitions[0].slices(0, 10**9)
    first = part.replicas[0]
    node = next(n for n in cluster.storages if n.admin_port == first.admin_port)
    batches = read_slice_records(part, batch_records=10, in_flight=1)
    rows = as_rows(0, iter([next(batches)]))
    node.kill()
    try:
        rows += as_rows(0, batches)
    finally:
        node.restart()
        cluster.wait_verified()
    assert rows == expected
