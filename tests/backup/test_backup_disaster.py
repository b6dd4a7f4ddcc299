"""Disaster recovery: every replica lost, the cluster rebuilt from a backup (issue 16).

All three storage nodes lose their directories at once. No replica is left to catch a restored
copy up, so each node is restored with `--all-replicas-lost`: its partitions take the store
session ZooKeeper last issued, the next recovery lets them vote with the backup's last
transaction, and the log resumes there. What was committed after the backup is gone (the
documented cost); everything in the backup is served, and new appends follow it densely.

With ZooKeeper lost too, the cluster is re-created first with the backup's key
(`waltz create-cluster --cluster-key`) and the storage nodes registered again.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from cluster_support import append_lines, local_cluster, run_waltz_cli, tailed, wait_serving

from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.devcluster.nodes import DEFAULT_CLUSTER_NAME
from waltz_engine.ops.inspect import verify as inspect_verify
from waltz_engine.storage.storage_manager import StorageManager

PARTITIONS = (0, 1)
BEFORE, LOST, AFTER = 30, 10, 10
REFUSAL_TIMEOUT_S = 60.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory, storages=3, servers=1, partitions=len(PARTITIONS), zookeeper=zookeeper
    ) as c:
        yield c


def _cli(*args: str) -> dict:
    result = run_waltz_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _waltz(*args: str) -> None:
    result = run_waltz_cli(*args)
    assert result.returncode == 0, result.stderr


def _rebuild_metadata(cluster: LocalCluster, config: str, key: str) -> None:
    """What an operator does when ZooKeeper's data is gone too: the cluster again, with the
    backup's key, and its storage nodes registered and assigned as before."""
    _waltz("zk", "delete", "-c", config, "--name", DEFAULT_CLUSTER_NAME)
    partitions = str(len(PARTITIONS))
    _waltz(
        "create-cluster",
        "-c",
        config,
        "--name",
        DEFAULT_CLUSTER_NAME,
        "--partitions",
        partitions,
        "--cluster-key",
        key,
    )
    every = f"0-{len(PARTITIONS) - 1}"
    for node in cluster.storages:
        storage = node.connect_string
        _waltz("zk", "add-storage-node", "-c", config, "-s", storage, "-a", str(node.admin_port), "-g", "0")
        _waltz("zk", "assign-partition", "-c", config, "-s", storage, "-p", every)


def _lines(cluster: LocalCluster, tag: str, count: int) -> None:
    append_lines(cluster, {p: [f"{tag}-{p}-{i}" for i in range(count)] for p in PARTITIONS})


def _lose_everything(cluster: LocalCluster, config: str, url: str, zookeeper_lost: bool) -> None:
    """A backup, more commits, then every storage directory gone (and ZooKeeper's data too)."""
    _lines(cluster, "before", BEFORE)
    _cli("backup", "create", "-c", config, "--to", url)
    _lines(cluster, "lost", LOST)
    (server,) = cluster.servers
    assert server.stop()
    for node in cluster.storages:
        node.kill()
        shutil.rmtree(node.directory / "data")
    if zookeeper_lost:
        _rebuild_metadata(cluster, config, _cli("backup", "list", url)["cluster_key"])


def _restore_all(cluster: LocalCluster, config: str, url: str, *flags: str) -> None:
    for node in cluster.storages:
        data = str(node.directory / "data")
        restored = _cli("backup", "restore", url, "--to", data, "-c", config, *flags)
        assert {p: v["last_txid"] for p, v in restored["partitions"].items()} == {
            str(p): BEFORE - 1 for p in PARTITIONS
        }
        assert inspect_verify(node.directory / "data").ok


@pytest.mark.parametrize("zookeeper_lost", [False, True], ids=["zookeeper-kept", "zookeeper-lost"])
def test_every_replica_lost_then_rebuilt_from_a_backup(
    zookeeper_lost: bool, cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = str(tmp_path_factory.mktemp("backup") / "b")
    config = str(cluster.client_config_path)
    _lose_everything(cluster, config, url, zookeeper_lost)
    _restore_all(cluster, config, url, "--all-replicas-lost")
    (server,) = cluster.servers
    for node in cluster.storages:
        node.start()
    server.start()
    wait_serving(cluster, PARTITIONS)
    try:
        _lines(cluster, "after", AFTER)
    except AssertionError as e:
        logs = "\n".join(f"--- {n.name}\n{n.log_text()[-3000:]}" for n in (server, *cluster.storages))
        raise AssertionError(f"{e}\n{logs}") from None
    cluster.wait_verified()

    rows = tailed(cluster, PARTITIONS)
    for p in PARTITIONS:
        mine = [r for r in rows if r[0] == p]
        assert [r[1] for r in mine] == list(range(BEFORE + AFTER)), "txids are dense from 0"
        texts = [bytes.fromhex(r[-1]).decode() for r in mine]
        assert texts == [f"before-{p}-{i}" for i in range(BEFORE)] + [f"after-{p}-{i}" for i in range(AFTER)]


def test_a_re_created_cluster_never_cuts_restored_copies_that_cannot_vote(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The misuse: ZooKeeper re-created, the nodes restored without --all-replicas-lost. Its
    first recovery resolves an empty log; it used to truncate every restored copy to nothing
    (only the low-water mark write after it was refused). It must refuse, and cut nothing."""
    url = str(tmp_path_factory.mktemp("backup") / "b")
    config = str(cluster.client_config_path)
    _lose_everything(cluster, config, url, zookeeper_lost=True)
    _restore_all(cluster, config, url)
    (server,) = cluster.servers
    for node in cluster.storages:
        node.start()
    server.start()
    deadline = time.monotonic() + REFUSAL_TIMEOUT_S
    while "not cutting committed records" not in server.log_text():
        assert time.monotonic() < deadline, server.log_text()[-3000:]
        time.sleep(0.2)
    assert server.stop()
    key = uuid.UUID(_cli("backup", "list", url)["cluster_key"])
    for node in cluster.storages:
        assert node.stop()
        with StorageManager(node.directory / "data", key, len(PARTITIONS)) as manager:
            for p in PARTITIONS:
                assert manager.partition(p).max_transaction_id() == BEFORE - 1, node.name


def test_all_replicas_lost_is_refused_while_a_replica_or_a_server_survives(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The flag makes restored copies vote: with a replica holding newer commits still up, they
    could outvote it and commits would be cut. So it is refused then, and while servers run."""
    url = str(tmp_path_factory.mktemp("backup") / "b")
    config = str(cluster.client_config_path)
    _lines(cluster, "before", BEFORE)
    _cli("backup", "create", "-c", config, "--to", url)
    _lines(cluster, "newer", LOST)
    target = str(tmp_path_factory.mktemp("restore") / "data")

    def refused() -> str:
        result = run_waltz_cli("backup", "restore", url, "--to", target, "--all-replicas-lost", "-c", config)
        assert result.returncode == 1, result.stdout
        (line,) = result.stderr.strip().splitlines()
        return line

    assert "server(s) registered" in refused()
    (server,) = cluster.servers
    assert server.stop()
    line = refused()
    assert f"up to transaction {BEFORE + LOST - 1}, past the backup's end: a replica survives" in line, line
    server.start()
