"""Operator commands against real ZooKeeper and three real storage nodes, with no Waltz server:
the verify validations that need no server (with forced failures), recover, truncate, forced
assignment, and the one-line errors of the server-facing commands."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_support import (
    NUM_PARTITIONS,
    StorageCluster,
    invoke,
    ok_json,
    one_line_error,
    storage_cluster,
    write_records,
)
from storage_node_support import ISSUED_SESSION_ID, StorageNodeProcess, client_ssl, make_records
from testkit import free_tcp_port

from waltz_engine.common.address import HostPort
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StorageContext
from waltz_engine.zk.cluster_manager import read_forced_assignments
from waltz_engine.zk.connection import connect
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import (
    UNRESOLVED_HIGH_WATER_MARK,
    PartitionAssignment,
    PartitionInfo,
    PartitionMetadata,
    ReplicaId,
    ReplicaState,
    ServerDescriptor,
    ServerPartitions,
)
from waltz_engine.zk.store_metadata import (
    read_partition_metadata,
    read_store_params,
    write_partition_metadata,
)

ZK_VALIDITY = "PARTITION_ASSIGNMENT_ZK_VALIDITY"
ZK_SERVER = "PARTITION_ASSIGNMENT_ZK_SERVER_CONSISTENCY"
CONNECTIVITY = "SERVER_STORAGE_CONNECTIVITY"
ZK_STORAGE = "PARTITION_ASSIGNMENT_ZK_STORAGE_CONSISTENCY"
QUORUM = "PARTITION_QUORUM_STATUS"
RECOVERY = "REPLICA_RECOVERY_STATUS"
HEALTH = "SERVER_PARTITION_HEALTH_CHECK"
ORDER = [ZK_VALIDITY, ZK_SERVER, CONNECTIVITY, ZK_STORAGE, QUORUM, RECOVERY, HEALTH]
FAKE_SERVER_ID = 42
OTHER_FAKE_SERVER_ID = 43


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageCluster]:
    with storage_cluster(zookeeper, tmp_path_factory.mktemp("operator")) as c:
        yield c


def verify_json(cluster: StorageCluster, *extra: str) -> tuple[int, dict[str, Any]]:
    import json

    result = invoke("cluster", "verify", *cluster.where, "--timeout-ms", "5000", "--json", *extra)
    assert "Traceback" not in result.output
    assert result.stdout, result.stderr
    return result.exit_code, json.loads(result.stdout)


def errors_of(report: dict[str, Any], partition: int) -> dict[str, list[str]]:
    [found] = [p for p in report["partitions"] if p["partition"] == partition]
    assert [v["validation"] for v in found["validations"]] == ORDER
    return {v["validation"]: v["errors"] for v in found["validations"] if not v["passed"]}


def on_admin(node: StorageNodeProcess, action: Any) -> Any:
    return node.run(node.with_admin(action))


# --- verify without a server -------------------------------------------------------------------


def test_verify_without_server_fails_assignment_and_server_validations(cluster: StorageCluster) -> None:
    code, report = verify_json(cluster)
    assert code == 1 and report["passed"] is False
    for p in range(NUM_PARTITIONS):
        errors = errors_of(report, p)
        assert errors[ZK_VALIDITY] == [f"Error: Partition {p} not handled by any server"]
        for kind in (ZK_SERVER, CONNECTIVITY, HEALTH):
            assert errors[kind] == ["No Server Endpoint found."]
        # All three nodes hold and serve every partition: storage checks pass.
        assert ZK_STORAGE not in errors and QUORUM not in errors
    text = invoke("cluster", "verify", *cluster.where, "-p", "0", "--timeout-ms", "5000")
    assert text.exit_code == 1
    assert "Error: Partition 0 not handled by any server" in text.stdout
    assert text.stdout.strip().splitlines()[-1] == "Failed"
    one_line_error(
        invoke("cluster", "verify", *cluster.where, "-p", "9"), "Partition 9 does not belong to the cluster"
    )


def test_verify_quorum_and_storage_assignment_failures(cluster: StorageCluster) -> None:
    a, b, c = cluster.nodes
    try:
        for node in (a, b):
            on_admin(node, lambda admin: admin.set_partition_available([1], False))
        _, report = verify_json(cluster)
        assert errors_of(report, 1)[QUORUM] == ["Error: Quorum is not achieved"]
        assert ZK_STORAGE not in errors_of(report, 1)  # unavailable, but still assigned
        assert QUORUM not in errors_of(report, 0)
        on_admin(c, lambda admin: admin.set_partition_assignment([1], False, False))
        _, report = verify_json(cluster)
        assert errors_of(report, 1)[ZK_STORAGE] == [
            "Error: ZooKeeper and StorageNode Partition Assignment mismatch"
        ]
        assert ZK_STORAGE not in errors_of(report, 0)
    finally:
        on_admin(c, lambda admin: admin.set_partition_assignment([1], True, False))
        for node in (a, b):
            on_admin(node, lambda admin: admin.set_partition_available([1], True))
    _, report = verify_json(cluster)
    assert QUORUM not in errors_of(report, 1) and ZK_STORAGE not in errors_of(report, 1)


def test_verify_replica_recovery_status(cluster: StorageCluster) -> None:
    a, b, c = (cluster.storage(n) for n in cluster.nodes)
    stranger = "127.0.0.1:1"
    # The session the test cluster issued: a lower one would make the nodes refuse the other
    # tests' sessions (ZooKeeper never lowers it).
    issued = ISSUED_SESSION_ID
    states = (
        ReplicaState(ReplicaId(0, a), issued, UNRESOLVED_HIGH_WATER_MARK),
        ReplicaState(ReplicaId(0, b), issued - 1, UNRESOLVED_HIGH_WATER_MARK),  # an older session
        ReplicaState(ReplicaId(0, stranger), issued, UNRESOLVED_HIGH_WATER_MARK),
    )
    with connect(cluster.settings()) as zk:
        version = read_partition_metadata(zk, cluster.root, 0).version
        version = write_partition_metadata(zk, cluster.root, 0, PartitionMetadata(1, issued, states), version)
    _, report = verify_json(cluster)
    assert sorted(errors_of(report, 0)[RECOVERY]) == sorted(
        [
            f"Storage {b} recovery not completed",
            f"Storage {stranger} replica info missing in replica assignments",
            f"Storage {c} replica info missing in replica states",
        ]
    )
    complete = tuple(ReplicaState(ReplicaId(0, s), issued, UNRESOLVED_HIGH_WATER_MARK) for s in (a, b, c))
    closing = complete[:2] + (ReplicaState(ReplicaId(0, c), issued, 17),)  # a closing high-water mark is set
    with connect(cluster.settings()) as zk:
        closing_metadata = PartitionMetadata(1, issued, closing)
        version = write_partition_metadata(zk, cluster.root, 0, closing_metadata, version)
        _, report = verify_json(cluster)
        assert errors_of(report, 0)[RECOVERY] == [f"Storage {c} recovery not completed"]
        write_partition_metadata(zk, cluster.root, 0, PartitionMetadata(1, issued, complete), version)
    _, report = verify_json(cluster)
    assert RECOVERY not in errors_of(report, 0)


# --- recover -------------------------------------------------------------------------------------


def test_recover_opens_a_session_that_verify_sees_complete(cluster: StorageCluster) -> None:
    first = ok_json("recover", *cluster.where, "-p", "1", "--timeout-ms", "60000")
    assert first["partition"] == 1 and first["high_water_mark"] == -1
    replicas = first["status"]["session"]["replicas"]
    assert sorted(r["storage"] for r in replicas) == sorted(cluster.storage(n) for n in cluster.nodes)
    _, report = verify_json(cluster)
    assert RECOVERY not in errors_of(report, 1)
    second = invoke("recover", *cluster.where, "-p", "1")
    assert second.exit_code == 0, second.stderr
    assert f"session {first['session_id'] + 1}" in second.stdout and "high-water mark -1" in second.stdout
    with connect(cluster.settings()) as zk:
        assert read_partition_metadata(zk, cluster.root, 1).metadata.session_id == first["session_id"] + 1
    one_line_error(invoke("recover", *cluster.where, "-p", "7"), "Partition 7 does not belong")


# --- truncate ------------------------------------------------------------------------------------


def test_truncate_offline_only_above_the_low_water_mark_unless_forced(cluster: StorageCluster) -> None:
    node = cluster.nodes[0]
    admin = f"{node.host}:{node.admin_port}"
    args = ("truncate", *cluster.where, "-s", cluster.storage(node), "-p", "0")  # its data address
    # The original's form: the admin address and the data port (-sp, a hidden alias).
    original = ("truncate", *cluster.where, "-s", admin, "-sp", str(node.port), "-p", "0")
    asyncio.run(write_records(node, 0, 0, 10, lwm=4))
    one_line_error(invoke(*args, "--to", "6"), "is available", "waltz storage availability", "--offline")
    with connect(cluster.settings()) as zk:
        key = read_store_params(zk, cluster.root).key
    context = StorageContext(key, NUM_PARTITIONS, client_ssl())
    try:
        on_admin(node, lambda a: a.set_partition_available([0], False))
        one_line_error(invoke(*args, "--to", "2"), "below the replica's low-water mark 4", "--force")
        cut = ok_json(*args, "--to", "6")
        assert (cut["old_max_transaction_id"], cut["new_max_transaction_id"], cut["removed"]) == (9, 6, 3)
        assert cut["storage"] == cluster.storage(node)
        kept = on_admin(node, lambda a: a.record_list(0, 0, 100))
        assert kept == make_records(0, 7, 0)
        address = HostPort(node.host, node.admin_port)
        assert asyncio.run(admin_ops.max_transaction_id(context, address, node.port, 0, offline=True)) == 6
        forced = invoke(*original, "--to", "2", "--force")
        assert forced.exit_code == 0, forced.stderr
        assert "max transaction id 6 -> 2 (4 transaction(s) removed)" in forced.stdout
        assert on_admin(node, lambda a: a.record_list(0, 0, 100)) == make_records(0, 3, 0)
    finally:
        on_admin(node, lambda a: a.set_partition_available([0], True))


# --- forced assignment and check-connectivity with a registered but unreachable server -----------


def _register_fake_servers(zk: Any, root: str, port: int) -> None:
    paths = ClusterPaths.of(root)
    for server_id in (FAKE_SERVER_ID, OTHER_FAKE_SERVER_ID):
        descriptor = ServerDescriptor(server_id, "127.0.0.1", port, ())
        zk.create(f"{paths.server_descriptors}/s_", descriptor.to_bytes(), ephemeral=True, sequence=True)
    assignment = PartitionAssignment(
        0,
        NUM_PARTITIONS,
        (
            ServerPartitions(FAKE_SERVER_ID, (PartitionInfo(0, 1), PartitionInfo(1, 1))),
            ServerPartitions(OTHER_FAKE_SERVER_ID, (PartitionInfo(1, 2),)),
        ),
    )
    zk.set(paths.server_descriptors, assignment.to_bytes())


def test_unreachable_server_connectivity_verify_and_forced_assignment(cluster: StorageCluster) -> None:
    port = free_tcp_port()  # nothing listens there
    endpoint = f"127.0.0.1:{port}"
    with connect(cluster.settings()) as zk:
        _register_fake_servers(zk, cluster.root, port)
        try:
            text = invoke("cluster", "check-connectivity", *cluster.where, "--timeout-ms", "3000")
            assert text.exit_code == 0, text.stderr
            assert text.stdout.count(f"Connectivity status of {endpoint} is: UNREACHABLE") == 2
            _, report = verify_json(cluster)
            errors0, errors1 = errors_of(report, 0), errors_of(report, 1)
            assert ZK_VALIDITY not in errors0
            assert errors1[ZK_VALIDITY] == [
                "Error: Partition handled by more than one server: "
                f"{FAKE_SERVER_ID} and {OTHER_FAKE_SERVER_ID}"
            ]
            assert errors0[CONNECTIVITY] == [f"Server {endpoint}, no connectivity statuses response"]
            assert errors0[ZK_SERVER][0].startswith(f"Server {endpoint}")
            assert errors0[HEALTH][0].startswith(f"Server {endpoint}")

            assigned = ok_json("server", "assign", *cluster.where, "--partition", "0", "--server", "42")
            assert assigned == {"partition": 0, "server_id": 42, "endpoint": endpoint, "changed": True}
            assert read_forced_assignments(zk, cluster.root) == {0: FAKE_SERVER_ID}
            again = invoke("server", "assign", *cluster.where, "-p", "0", "--server", "42")
            assert again.exit_code == 0 and "already forced" in again.stdout
            one_line_error(
                invoke("server", "assign", *cluster.where, "-p", "0", "--server", "7"),
                "Server 7 is not a live server",
                "42, 43",
            )
            one_line_error(
                invoke("server", "assign", *cluster.where, "-p", "5", "--server", "42"),
                "Partition 5 does not belong to the cluster",
            )
            assert ok_json("server", "unassign", *cluster.where, "-p", "0")["changed"] is True
            assert read_forced_assignments(zk, cluster.root) == {}
            nothing = invoke("server", "unassign", *cluster.where, "-p", "0")
            assert nothing.exit_code == 0 and "was not forced" in nothing.stdout
        finally:
            zk.set(ClusterPaths.of(cluster.root).server_descriptors, PartitionAssignment.initial().to_bytes())
    # The ephemeral descriptors went with that ZooKeeper session.
    assert invoke("cluster", "check-connectivity", *cluster.where).stdout.startswith("no live servers")


# --- one-line errors of the server-facing commands ---------------------------------------------


def test_server_commands_one_line_errors(tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_tcp_port()}"
    one_line_error(invoke("server", "list", "--http", "nohost"), "Http must be in format of host:port")
    one_line_error(invoke("server", "list", "--http", closed, "--timeout-ms", "2000"), "Cannot read metrics")
    one_line_error(
        invoke("server", "add-preferred-partition", "--server", closed, "-p", "0", "--timeout-ms", "2000"),
        f"Server {closed}",
    )
    one_line_error(
        invoke("server", "remove-preferred-partition", "--server", "bad", "-p", "0"), "host:server_port"
    )
    one_line_error(
        invoke("server", "add-preferred-partition", "--server", closed, "-p", "x"),
        "'x' in 'x' is not a partition id",
        exit_code=2,
    )
    # -s is a storage node everywhere: the server commands do not take it.
    assert invoke("server", "list", "-s", closed).exit_code == 2
