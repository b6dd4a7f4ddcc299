"""`waltz storage checksum --online` (issue 24 item 4): replicas of a committed range compared on
running nodes over their admin ports, by records, naming the first txid that differs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from cluster_support import append_lines, local_cluster, run_waltz_cli
from storage_node_support import make_records

from waltz_engine.common.record import Record
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.online_checksum import compare_sources
from waltz_engine.storage import StorageManager
from waltz_engine.storage.network_reader import PartitionSources, ReplicaSource, StoreAccess
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import read_store_params

TRANSACTIONS = 30
REWRITTEN_FROM = 20


def sources(readable: dict[str, int], committed: int) -> PartitionSources:
    replicas = tuple(ReplicaSource(name, "h", 1, 1, to, to) for name, to in readable.items())
    return PartitionSources(0, committed, replicas, StoreAccess(None, 1, None))  # type: ignore[arg-type]


def reader(logs: dict[str, list[Record]]) -> object:
    def read(replica: ReplicaSource, first: int, last: int) -> Iterator[list[Record]]:
        records = logs[replica.storage][first : last + 1]
        for i in range(0, len(records), 7):  # answers of a few records, as RECORD_LIST's
            yield records[i : i + 7]

    return read


def test_equal_replicas_have_one_checksum_and_a_difference_is_named_to_the_txid() -> None:
    good = make_records(0, 100)
    other = make_records(0, 100)
    other[63] = other[63]._replace(data=b"x" * len(other[63].data))
    logs = {"a": good, "b": list(good), "c": other}
    same = compare_sources(sources({"a": 99, "b": 99}, 99), 0, None, reader(logs), chunk_records=25)  # type: ignore[arg-type]
    assert same.equal and same.consistent and same.first_difference is None
    assert len({r.checksum for r in same.replicas}) == 1
    differ = compare_sources(sources({"a": 99, "c": 99}, 99), 10, 90, reader(logs), chunk_records=25)  # type: ignore[arg-type]
    assert differ.first_difference == 63 and not differ.consistent
    assert "differ at txid 63" in differ.verdict


def test_a_replica_behind_is_not_compared_and_the_range_stops_at_the_committed_mark() -> None:
    logs = {"a": make_records(0, 50), "b": make_records(0, 40)}
    result = compare_sources(sources({"a": 49, "b": 39}, 45), 0, 1000, reader(logs))  # type: ignore[arg-type]
    assert result.to_txid == 45
    assert [r.checksum is None for r in result.replicas] == [False, True]
    assert "behind" in result.replicas[1].note and not result.consistent
    empty = compare_sources(sources({"a": 49}, 45), 46, None, reader(logs))  # type: ignore[arg-type]
    assert empty.consistent and empty.verdict == "nothing committed in the range"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper) as c:
        append_lines(c, {0: [f"line-{i}" for i in range(TRANSACTIONS)]})
        yield c


def online(cluster: LocalCluster, *args: str) -> tuple[int, dict[str, object]]:
    done = run_waltz_cli(
        "storage", "checksum", "--online", "-p", "0", "--json", "-c", str(cluster.client_config_path), *args
    )
    assert done.stderr.count("\n") <= 1, done.stderr
    return done.returncode, json.loads(done.stdout)["partitions"][0]


def test_replicas_of_a_live_cluster_compare_equal(cluster: LocalCluster) -> None:
    code, result = online(cluster)
    assert code == 0 and result["equal"] is True, result
    assert result["to_txid"] == TRANSACTIONS - 1
    replicas = result["replicas"]
    assert isinstance(replicas, list) and len(replicas) == 3
    assert len({r["checksum"] for r in replicas}) == 1


def test_a_rewritten_replica_is_named_at_the_first_txid_that_differs(cluster: LocalCluster) -> None:
    node = cluster.storages[2]
    with connect(ZooKeeperSettings(cluster.zookeeper, cluster.cluster_root)) as zk:
        params = read_store_params(zk, cluster.cluster_root)
    node.stop()
    # Valid records (their CRCs check out) with other data: only a comparison by records sees it.
    with StorageManager(node.directory / "data", params.key, params.num_partitions) as manager:
        partition = manager.partition(0)
        partition.truncate(REWRITTEN_FROM - 1)
        partition.append(make_records(REWRITTEN_FROM, TRANSACTIONS - REWRITTEN_FROM))
    node.start()
    cluster.wait_verified()
    code, result = online(cluster, "--from", "5")
    assert code == 1 and result["first_difference"] == REWRITTEN_FROM, result
