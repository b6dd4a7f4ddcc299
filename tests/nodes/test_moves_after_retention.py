"""Replica moves, auto-recovery and restore once retention has run (issue 31), with real
processes, on one cluster: 4 storage nodes with small segments over a `file://` tier, 3 replicas
of one partition, one server re-replicating a node lost for 3 s.

1. `waltz storage decommission` of a replica copies from the retained start, the evicted range
   read back from the tier (the plan it prints says both);
2. a decommission killed mid-copy leaves its move recorded; the node it moved from is then
   killed, and the server takes the move over instead of leaving the partition at 2 of 3;
3. a replica restored from a backup (one big segment) into a node of 2 KB segments is written
   at that size from the retention bound on, and the node's retention then removes its head as
   on any replica;
4. a decommission killed mid-copy whose target is then lost has its move cancelled by the server
   (it would block the partition's re-replication the day its source is lost);
5. a copy's rate bound counts the bytes moved (whole records), not only their data.

Storage nodes learn the committed prefix only when a store session starts (another change
fixes that): the test restarts the server once so that retention and the tier may act.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nodes_support
import pytest
from cluster_support import local_cluster, run_waltz_cli
from nodes_support import await_none_under_replicated, kill_at, preload, replica_sets, short_session_config

from waltz_engine.common.address import HostPort
from waltz_engine.common.record import Record
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.ops.devcluster import LocalCluster, LocalNode
from waltz_engine.storage.admin_ops import (
    PartitionStatus,
    add_partitions,
    admin_client,
    client_ssl_context,
    list_partitions,
    read_store_layout,
    recover_partition,
    remove_partitions,
    set_availability,
)
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk import replica_moves
from waltz_engine.zk.connection import connect
from waltz_engine.zk.retention import retained_start_in, set_retention_bound

PARTITION = 0
REPLICAS = 3
GRACE_MS = 3_000
SEGMENT_BYTES = 2_048
RECORDS = 150
DATA_BYTES = 100
FIRST_BOUND = 80
SECOND_BOUND = 130
# A decommission copying at this rate is still copying when it is killed.
SLOW_COPY_BYTES_PER_S = 300
# The shortest session the test ZooKeeper grants: a killed decommission's lease goes with it.
LEASE_SESSION_TIMEOUT_MS = 4_000
WAIT_MS = 90_000
# How often the server looks at the nodes with that grace (auto_recovery: grace / 10, 1 s at least).
CHECK_INTERVAL_MS = 1_000
LEASE_HOLDER = "a test holding the lease"


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tier")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str, tier: Path) -> Iterator[LocalCluster]:
    storage_config = {
        "storage.segment.size.threshold": SEGMENT_BYTES,
        "storage.retention.check.interval.ms": 300,
        "storage.tier.url": tier.as_uri(),
        "storage.tier.local.bytes": 2 * SEGMENT_BYTES,
        "storage.tier.check.interval.ms": 100,
    }
    with local_cluster(
        tmp_path_factory,
        storages=4,
        servers=1,
        partitions=1,
        zookeeper=zookeeper,
        replicas=REPLICAS,
        storage_config=storage_config,
        server_config={"server.autoRecovery.graceMs": GRACE_MS},
    ) as c:
        preload(c, 1, RECORDS, DATA_BYTES)
        # Forced (see the module's docstring): a store session starts, the replicas' local
        # low-water marks rise to what is committed, and retention and the tier may act.
        c.servers[0].restart()
        preload(c, 1, 1, DATA_BYTES)
        yield c


@pytest.fixture(scope="module")
def tools_config(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    return short_session_config(cluster, tmp_path_factory.mktemp("tools"), LEASE_SESSION_TIMEOUT_MS)


@pytest.fixture(scope="module")
def backup(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A backup taken before retention runs (the first test asks for it so), in the backup's own
    segment size: one big segment."""
    path = tmp_path_factory.mktemp("backups") / "backup"
    created = run_waltz_cli("backup", "create", "-c", str(cluster.client_config_path), "--to", str(path))
    assert created.returncode == 0, created.stderr
    assert len(list((path / str(PARTITION)).glob("*.seg"))) == 1
    return path


def wait_for(what: str, check: Callable[[], bool]) -> None:
    nodes_support.wait_for(what, check, WAIT_MS)


def server_logs(cluster: LocalCluster) -> str:
    return "".join(server.log_text() for server in cluster.servers)


def node_named(cluster: LocalCluster, name: str) -> LocalNode:
    (node,) = [s for s in cluster.storages if s.connect_string == name]
    return node


def status(cluster: LocalCluster, name: str) -> PartitionStatus | None:
    """Partition 0 on storage node ``name`` as its metrics say (None: it does not answer or hold it)."""
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    context = layout.context(client_ssl_context(None), 3_000)
    try:
        node = asyncio.run(list_partitions(context, layout.admin_address(name), name))
    except Exception:  # noqa: BLE001 - a node down or starting answers nothing
        return None
    return next((s for s in node.partitions if s.partition_id == PARTITION and s.is_assigned), None)


def first_txid(cluster: LocalCluster, name: str) -> int:
    """Its ``first-transaction-id`` gauge (-1: no answer)."""
    node = node_named(cluster, name)
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    context = layout.context(client_ssl_context(None), 3_000)

    async def gauge() -> int:
        async with admin_client(context, HostPort("127.0.0.1", node.admin_port)) as admin:
            gauges = (await admin.metrics())["gauges"]
        entry = gauges.get(f"waltz-storage.partition-{PARTITION}.first-transaction-id")
        return -1 if entry is None else int(entry["value"])

    try:
        return asyncio.run(gauge())
    except Exception:  # noqa: BLE001 - a node down or starting answers nothing
        return -1


def holders(cluster: LocalCluster) -> set[str]:
    return replica_sets(cluster)[PARTITION]


def assert_replicas_caught_up_and_equal(cluster: LocalCluster, from_txid: int) -> None:
    """None under-replicated, and every replica equal from ``from_txid`` (the checksum reads no
    replica below its retained start)."""
    config = str(cluster.client_config_path)
    await_none_under_replicated(config)
    compared = run_waltz_cli(
        "storage", "checksum", "--online", "--from", str(from_txid), "--json", "-c", config
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr


def set_bound(cluster: LocalCluster, before: int) -> None:
    with connect(cluster.zookeeper_settings()) as zk:
        set_retention_bound(zk, cluster.cluster_root, PARTITION, before)


def refusal_below(cluster: LocalCluster, node: LocalNode, transaction_id: int) -> str:
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    context = layout.context(client_ssl_context(None), 3_000)

    async def read() -> str:
        async with admin_client(context, HostPort("127.0.0.1", node.admin_port)) as admin:
            try:
                await admin.record_list(PARTITION, transaction_id, 1)
            except StorageRpcError as e:
                return str(e)
        raise AssertionError(f"{node.name} served transaction {transaction_id}")

    return asyncio.run(read())


def test_decommission_after_retention_copies_from_the_retained_start_and_the_tier(
    cluster: LocalCluster, backup: Path
) -> None:
    replicas = sorted(holders(cluster))
    wait_for(
        "every replica's local low-water mark is up to the commits",
        lambda: all(
            (s := status(cluster, n)) is not None and s.local_low_water_mark >= RECORDS - 1 for n in replicas
        ),
    )
    set_bound(cluster, FIRST_BOUND)
    wait_for(
        "retention removed the head and the tier holds the rest, on every replica",
        lambda: all(
            first_txid(cluster, n) > 0
            and (s := status(cluster, n)) is not None
            and s.usage is not None
            and s.usage["evicted_segments"] > 0
            for n in replicas
        ),
    )
    starts = {first_txid(cluster, n) for n in replicas}
    assert len(starts) == 1, starts  # the same segments everywhere: the same retained start
    (start,) = starts
    assert 0 < start <= FIRST_BOUND

    leaving = replicas[0]
    (free,) = {s.connect_string for s in cluster.storages} - set(replicas)
    done = run_waltz_cli(
        "storage", "decommission", "-c", str(cluster.client_config_path), "-s", leaving, "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["remaining_partitions"] == []
    # The plan names where the copy starts and what of it is in the tier only.
    assert f"from the retained start {start} (retention removed below)" in done.stderr, done.stderr
    assert re.search(rf"are in the tier only: \S+ downloads them, {re.escape(free)} writes them", done.stderr)
    assert "com.wepay" not in done.stderr
    assert holders(cluster) == set(replicas[1:]) | {free}
    assert first_txid(cluster, free) == start
    assert_replicas_caught_up_and_equal(cluster, start)


def test_a_killed_decommission_then_its_node_lost_is_re_replicated(
    cluster: LocalCluster, tools_config: str
) -> None:
    before = sorted(holders(cluster))
    leaving = before[0]
    (free,) = {s.connect_string for s in cluster.storages} - set(before)
    command = ["storage", "decommission", "-c", tools_config, "-s", leaving]
    kill_at([*command, "--bytes-per-second", str(SLOW_COPY_BYTES_PER_S)], "copying from")
    with connect(cluster.zookeeper_settings()) as zk:
        (recorded,) = replica_moves.read_moves(zk, cluster.cluster_root)
    assert (recorded.source, recorded.target, recorded.reason) == (leaving, free, "decommission")

    # Another mover holds the lease while the node is lost: the server says so, once.
    waiting = f"are past the grace, but {LEASE_HOLDER} moves replicas now: waiting for it"
    with connect(cluster.zookeeper_settings()) as zk:
        assert replica_moves.wait_lease(zk, cluster.cluster_root, LEASE_HOLDER, WAIT_MS)
        node_named(cluster, leaving).kill()
        wait_for("the server says it waits for the lease", lambda: waiting in server_logs(cluster))
        # Nothing marks a check that said nothing: let a few go by.
        time.sleep(3 * CHECK_INTERVAL_MS / 1000)
        assert server_logs(cluster).count(waiting) == 1, server_logs(cluster)
    wait_for(
        "the partition has 3 replicas on live nodes again",
        lambda: holders(cluster) == (set(before) - {leaving}) | {free},
    )
    logs = server_logs(cluster)
    assert f"taking over the decommission move from {leaving} to {free}" in logs, logs
    assert_replicas_caught_up_and_equal(cluster, max(first_txid(cluster, n) for n in holders(cluster)))
    node_named(cluster, leaving).start()


def test_a_replica_restored_into_small_segments_is_retained_like_any_other(
    cluster: LocalCluster, backup: Path
) -> None:
    url = str(backup)
    name = sorted(holders(cluster))[0]
    node = node_named(cluster, name)
    node.kill()
    shutil.rmtree(node.data_directory)
    restored = run_waltz_cli(
        "backup",
        "restore",
        url,
        "--to",
        str(node.data_directory),
        "--storage-config",
        str(node.config_path),
        "--json",
    )
    assert restored.returncode == 0, restored.stderr
    # Nothing below the retention bound came back; the rest in the node's segment size.
    summary = json.loads(restored.stdout)
    assert summary["partitions"][str(PARTITION)]["first_txid"] == FIRST_BOUND
    assert (summary["segment_size_bytes"], summary["retention_bounds_read"]) == (SEGMENT_BYTES, True)
    segments = sorted((node.data_directory / str(PARTITION)).glob("*.seg"))
    assert int(segments[0].stem) == FIRST_BOUND and len(segments) > 3, segments
    assert all(s.stat().st_size <= SEGMENT_BYTES + 2 * (DATA_BYTES + 40) for s in segments)
    node.start()
    assert retained_start_in(refusal_below(cluster, node, FIRST_BOUND - 1)) == FIRST_BOUND
    cluster.wait_verified()

    # Retention goes on with the restored replica as with the others.
    set_bound(cluster, SECOND_BOUND)
    wait_for("the restored replica's head is removed", lambda: first_txid(cluster, name) > FIRST_BOUND)
    assert first_txid(cluster, name) <= SECOND_BOUND
    assert retained_start_in(refusal_below(cluster, node, FIRST_BOUND)) == first_txid(cluster, name)


def test_a_killed_decommission_then_its_target_lost_is_cancelled(
    cluster: LocalCluster, tools_config: str
) -> None:
    before = holders(cluster)
    leaving = sorted(before)[0]
    (free,) = {s.connect_string for s in cluster.storages} - before
    command = ["storage", "decommission", "-c", tools_config, "-s", leaving, "--wait"]
    kill_at([*command, "--bytes-per-second", str(SLOW_COPY_BYTES_PER_S)], "copying from")
    target = node_named(cluster, free)
    target.kill()

    def recorded() -> list[replica_moves.ReplicaMove]:
        with connect(cluster.zookeeper_settings()) as zk:
            return replica_moves.read_moves(zk, cluster.cluster_root)

    wait_for("the stale move is cancelled", lambda: not recorded())
    logs = server_logs(cluster)
    assert f"cancelled the decommission move from {leaving} to {free}: its target is lost" in logs, logs
    assert holders(cluster) == before
    target.start()


def test_the_copy_rate_bounds_the_bytes_moved(cluster: LocalCluster) -> None:
    """What a copy's rate bound (`decommission --bytes-per-second`) is handed: every record whole
    (its 40 bytes of header and checksums, and its data), not the data alone."""
    source = sorted(holders(cluster))[0]
    (free,) = {s.connect_string for s in cluster.storages} - holders(cluster)
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    context = layout.context(client_ssl_context(None), 10_000)
    target = layout.resolve_node(free)
    handed: list[int] = []

    async def throttle(size_bytes: int) -> None:
        handed.append(size_bytes)

    async def copy() -> list[Record]:
        await add_partitions(context, target.admin, [PARTITION])
        await set_availability(context, target.admin, [PARTITION], online=False)
        try:
            result = await recover_partition(
                context,
                layout.admin_address(source),
                target.admin,
                target.data_port(),
                PARTITION,
                throttle=throttle,
                cut_above_source=True,
            )
            first = result.final - result.records_copied + 1
            async with admin_client(context, target.admin) as admin:
                return await admin.record_list(PARTITION, first, result.records_copied)
        finally:
            await remove_partitions(context, target.admin, [PARTITION], delete_storage_files=True)

    copied = asyncio.run(copy())
    assert copied and sum(handed) == sum(RECORD_OVERHEAD_BYTES + len(r.data) for r in copied)
