"""`waltz storage` admin commands: input checks and unreachable nodes (real ZooKeeper, no node).

Every bad input must end in one line on stderr and exit 1, without a traceback.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from testkit import free_tcp_port
from typer.testing import CliRunner, Result

from waltz_cli.main import app
from waltz_engine.common.address import AddressError, HostPort, parse_host_port
from waltz_engine.common.errors import without_java_class
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import PartitionStatus, StorageAdminError, StorageNode
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.retention import retained_start_in

NUM_PARTITIONS = 4
LOCALHOST = "127.0.0.1"

runner = CliRunner()


def _run(*args: str) -> Result:
    return runner.invoke(app, ["storage", *args])


def _assert_one_line_error(result: Result, *fragments: str, exit_code: int = 1) -> str:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, line
    return line


@pytest.fixture
def where(zookeeper: str, cluster_root: str, zk_client: Any) -> tuple[str, ...]:
    """A cluster with 4 partitions and one registered storage node that nothing serves."""
    create_cluster(zk_client, cluster_root, "inputs", NUM_PARTITIONS)
    port, admin_port = free_tcp_port(), free_tcp_port()
    storage = f"{LOCALHOST}:{port}"
    store_metadata.add_storage_node(zk_client, cluster_root, storage, 0, admin_port)
    store_metadata.assign_partitions(zk_client, cluster_root, storage, [0, 1])
    return ("-z", zookeeper, "-r", cluster_root)


# --- library pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["localhost", "a:b:c", "host:", ":5", "host:0", "host:65536", "host:x"])
def test_parse_address_rejects_malformed(text: str) -> None:
    with pytest.raises(AddressError, match="Storage must be in format of host:admin_port"):
        parse_host_port(text, "Storage", "host:admin_port")


def test_parse_address() -> None:
    assert parse_host_port("db-1.example:55281") == HostPort("db-1.example", 55281)
    assert str(HostPort("h", 1)) == "h:1"


def test_check_partitions() -> None:
    assert admin_ops.check_partitions([3, 1, 1, 0], 4) == [0, 1, 3]
    with pytest.raises(StorageAdminError, match=r"in \[2, 9\] does not belong to the cluster: 4-9"):
        admin_ops.check_partitions(list(range(2, 10)), 4)
    with pytest.raises(StorageAdminError, match="does not belong"):
        admin_ops.check_partitions([-1], 4)
    with pytest.raises(StorageAdminError, match="no partitions"):
        admin_ops.check_partitions([0], 0)


@pytest.mark.parametrize("size", [-1, 0, admin_ops.MAX_RECOVERY_BATCH_SIZE + 1])
def test_batch_size_bounds(size: int) -> None:
    with pytest.raises(StorageAdminError, match="Batch size must be a positive integer"):
        admin_ops.check_batch_size(size)
    assert admin_ops.check_batch_size(admin_ops.MAX_RECOVERY_BATCH_SIZE) == admin_ops.MAX_RECOVERY_BATCH_SIZE


def test_plan_sync_as_the_original() -> None:
    # 0 assigned+available: kept; 1 assigned but unavailable: re-assigned; 2 absent: assigned;
    # 3 held but not in ZooKeeper: un-assigned.
    assert admin_ops.plan_sync([0, 1, 2], {0: True, 1: False, 3: True}) == ([1, 2], [3])
    assert admin_ops.plan_sync([], {}) == ([], [])


def _metrics(gauges: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4.0.0", "gauges": {k: {"value": v} for k, v in gauges.items()}}


def test_partition_status_from_metrics() -> None:
    address = HostPort("h", 1)
    big = 1 << 40  # the original's asInt would cut this; we keep 64 bits
    metrics = _metrics(
        {
            admin_ops.GAUGE_PARTITION_IDS: [2, 0, 5],
            **{f"waltz-storage.partition-0.{k}": v for k, v in (("session-id", big), ("flags", 5))},
            "waltz-storage.partition-0.low-water-mark": 9,
            "waltz-storage.partition-0.local-low-water-mark": 10,
            **{f"waltz-storage.partition-2.{k}": -1 for k in ("session-id", "low-water-mark")},
            "waltz-storage.partition-2.local-low-water-mark": -1,
            "waltz-storage.partition-2.flags": 4,
            # partition 5 closed while metrics were taken: null gauges, left out
            **{
                f"waltz-storage.partition-5.{k}": None
                for k in ("session-id", "low-water-mark", "local-low-water-mark", "flags")
            },
        }
    )
    statuses = admin_ops.partition_status_from_metrics(metrics, address)
    assert statuses == [PartitionStatus(0, big, 9, 10, 5), PartitionStatus(2, -1, -1, -1, 4)]
    assert (statuses[0].is_assigned, statuses[0].is_available) == (True, True)
    assert (statuses[1].is_assigned, statuses[1].is_available) == (True, False)
    assert statuses[0].to_json()["session_id"] == big


def test_a_node_that_says_nothing_of_retention_cannot_start_a_log_late() -> None:
    """A Java 0.13.2 node's metrics have neither our node gauge nor a partition's
    first-transaction-id: a copy past retention is refused to it (replica_mover, recovery)."""
    address = HostPort("h", 1)
    java = _metrics({admin_ops.GAUGE_PARTITION_IDS: [0], "waltz-storage.partition-0.flags": 5})
    ours = _metrics({admin_ops.GAUGE_PARTITION_IDS: [], "waltz-storage.waltz-storage-starts-late": True})
    older = _metrics(
        {admin_ops.GAUGE_PARTITION_IDS: [0], "waltz-storage.partition-0.first-transaction-id": 70}
    )
    assert [admin_ops.starts_late(m) for m in (java, ours, older)] == [False, True, True]
    with_gauges = {
        **older["gauges"],
        **{f"waltz-storage.partition-0.{k}": {"value": 1} for k in ("session-id", "low-water-mark", "flags")},
        "waltz-storage.partition-0.local-low-water-mark": {"value": 1},
    }
    (status,) = admin_ops.partition_status_from_metrics({"gauges": with_gauges}, address)
    assert status.first_transaction_id == 70


def test_a_node_failure_reads_without_the_java_class_name() -> None:
    wire = (
        "Partition 0 failed to recover. record list request to h:1: com.wepay.waltz.storage.exception."
        "StorageException: transaction 0 of partition 0 is below the retained start 170 "
        "(removed by retention)"
    )
    assert without_java_class(wire) == (
        "Partition 0 failed to recover. record list request to h:1: transaction 0 of partition 0 is "
        "below the retained start 170 (removed by retention)"
    )
    assert (
        without_java_class("java.lang.Exception: Partition:0 is not assigned.")
        == "Partition:0 is not assigned."
    )
    assert retained_start_in(without_java_class(wire)) == retained_start_in(wire) == 170


@pytest.mark.parametrize(
    ("gauges", "fragment"),
    [
        ({}, "no gauge waltz-storage.waltz-storage-partition-ids"),
        ({admin_ops.GAUGE_PARTITION_IDS: [1]}, "no gauge waltz-storage.partition-1.session-id"),
        ({admin_ops.GAUGE_PARTITION_IDS: "x"}, "waltz-storage-partition-ids is 'x'"),
    ],
)
def test_partition_status_from_bad_metrics(gauges: dict[str, Any], fragment: str) -> None:
    with pytest.raises(StorageAdminError, match=fragment):
        admin_ops.partition_status_from_metrics(_metrics(gauges), HostPort("h", 1))
    with pytest.raises(StorageAdminError, match="metrics have no gauges"):
        admin_ops.partition_status_from_metrics({}, HostPort("h", 1))


# --- CLI: bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("storage", ["localhost", "host:1:2", "host:99999"])
def test_malformed_storage_is_one_line(where: tuple[str, ...], storage: str) -> None:
    for args in (
        ("list", "-s", storage),
        ("add-partition", "-s", storage, "-p", "0"),
        ("remove-partition", "-s", storage, "-p", "0"),
        ("availability", "-s", storage, "-p", "0", "--online"),
        ("max-transaction-id", "-s", storage, "--storage-port", "1", "-p", "0"),
        ("recover-partition", "-s", storage, "--destination-storage", "h:1", "-p", "0"),
        ("recover-partition", "-s", "h:1", "--destination-storage", storage, "-p", "0"),
    ):
        _assert_one_line_error(
            _run(*args, *where),
            "Storage must be in format of host:port (the data address as registered, or host:admin_port)",
            storage,
        )


def test_bad_ranges_and_partitions_out_of_range(where: tuple[str, ...]) -> None:
    storage = f"{LOCALHOST}:{free_tcp_port()}"
    # A malformed list is a usage error (exit 2), caught by the parser.
    add = ("add-partition", "-s", storage)
    _assert_one_line_error(_run(*add, "-p", "3-1", *where), "goes backwards", exit_code=2)
    _assert_one_line_error(_run(*add, "-p", "0,x", *where), "'x'", exit_code=2)
    _assert_one_line_error(
        _run("add-partition", "-s", storage, "-p", "2-9", *where), "does not belong to the cluster: 4-9"
    )
    _assert_one_line_error(
        _run("max-transaction-id", "-s", storage, "--storage-port", "1", "-p", "4", *where), "does not belong"
    )
    recover = ("recover-partition", "-s", storage, "--destination-storage", storage)
    _assert_one_line_error(
        _run(*recover, "--destination-storage-port", "1", "-p", "4", *where), "does not belong"
    )
    # A negative partition id is refused by the parser (a usage error), before anything is asked.
    negative = _run(*recover, "--destination-storage-port", "1", "-p", "-1", *where)
    assert negative.exit_code == 2 and "Traceback" not in negative.output
    assert "Invalid value for '--partition'" in negative.output


@pytest.mark.parametrize("size", ["-3", "0"])
def test_bad_batch_size(where: tuple[str, ...], size: str) -> None:
    storage = f"{LOCALHOST}:{free_tcp_port()}"
    result = _run(
        "recover-partition",
        "-s",
        storage,
        "--destination-storage",
        storage,
        "--destination-storage-port",
        "1",
        "-p",
        "0",
        "-b",
        size,
        *where,
    )
    _assert_one_line_error(result, "Batch size must be a positive integer", size)


def test_online_or_offline_must_be_said(where: tuple[str, ...]) -> None:
    result = _run("availability", "-s", f"{LOCALHOST}:1", "-p", "0", *where)
    _assert_one_line_error(result, "give --online or --offline")
    # The original's `-o true|false` is gone: -o is --output everywhere, and switches take no value.
    old = _run("availability", "-s", f"{LOCALHOST}:1", "-p", "0", "-o", "true", *where)
    assert old.exit_code == 2 and "Traceback" not in old.output


def test_an_unregistered_admin_address_needs_the_data_port(where: tuple[str, ...]) -> None:
    """The original's form (host:admin_port) of a node ZooKeeper does not know: its data port
    cannot be looked up, so the commands that need it say how to give it."""
    storage = f"{LOCALHOST}:{free_tcp_port()}"
    for args in (
        ("max-transaction-id", "-s", storage, "-p", "0"),
        ("recover-partition", "-s", storage, "--destination-storage", storage, "-p", "0"),
    ):
        _assert_one_line_error(
            _run(*args, *where), f"storage node {storage} is not registered in ZooKeeper", "--storage-port"
        )


def test_storage_is_resolved_from_its_data_or_admin_address(zk_client: Any, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "resolve", NUM_PARTITIONS)
    store_metadata.add_storage_node(zk_client, cluster_root, "db-1:7000", 0, 7001)
    store_metadata.add_storage_node(zk_client, cluster_root, "db-2:7000", 1, 7001)
    layout = admin_ops.read_store_layout(zk_client, cluster_root)
    by_data = layout.resolve_node("db-2:7000")
    assert by_data == StorageNode(HostPort("db-2", 7001), HostPort("db-2", 7000), "db-2:7000")
    assert (by_data.data_port(), by_data.data_port(7100)) == (7000, 7100)
    assert layout.resolve_node("DB-1:7001") == StorageNode(
        HostPort("DB-1", 7001), HostPort("db-1", 7000), "db-1:7000"
    )
    unknown = layout.resolve_node("db-3:7001")
    assert unknown == StorageNode(HostPort("db-3", 7001), None, None)
    assert unknown.data_port(7000) == 7000
    with pytest.raises(StorageAdminError, match="is not registered in ZooKeeper"):
        unknown.data_port()


def test_missing_zookeeper_settings_is_one_line() -> None:
    _assert_one_line_error(_run("list", "-s", f"{LOCALHOST}:1"), "zookeeper.connectString")


# --- CLI: unreachable nodes ----------------------------------------------------------------------


def test_unreachable_node_is_one_line(where: tuple[str, ...], zk_client: Any, cluster_root: str) -> None:
    storage = f"{LOCALHOST}:{free_tcp_port()}"
    timeout = ("--timeout-ms", "3000")
    _assert_one_line_error(
        _run("list", "-s", storage, *timeout, *where), f"Cannot fetch partition ownership for {storage}"
    )
    # Without --storage, the node registered in ZooKeeper is asked (and nobody answers).
    _assert_one_line_error(_run("list", *timeout, *where), "Cannot fetch partition ownership for")
    _assert_one_line_error(
        _run("add-partition", "-s", storage, "-p", "0-1", *timeout, *where),
        f"Failed to add partition 0-1 to {storage}",
        "cannot open storage admin connection",
    )
    _assert_one_line_error(
        _run("availability", "-s", storage, "-p", "1", "--offline", *timeout, *where),
        f"Failed to set availability of partition 1 to false for {storage}",
    )
    _assert_one_line_error(
        _run("max-transaction-id", "-s", storage, "--storage-port", "1", "-p", "0", *timeout, *where),
        f"Failed to read max transaction ID for storage {storage}",
    )
    _assert_one_line_error(
        _run("sync-partitions", *timeout, *where), "Partition assignment cannot be fully synced"
    )
    recover = ("recover-partition", "-s", storage, "--destination-storage", storage)
    _assert_one_line_error(
        _run(*recover, "--destination-storage-port", "1", "-p", "0", *timeout, *where),
        "Partition 0 failed to recover",
    )
    # The node registered in ZooKeeper, named by its data address: its admin port is asked.
    [registered] = admin_ops.read_store_layout(zk_client, cluster_root).admin_ports
    registered_admin = admin_ops.read_store_layout(zk_client, cluster_root).admin_address(registered)
    _assert_one_line_error(
        _run("add-partition", "-s", registered, "-p", "0", *timeout, *where),
        f"Failed to add partition 0 to {registered_admin}",
    )
    _assert_one_line_error(
        _run("max-transaction-id", "-s", registered, "-p", "0", *timeout, *where),
        f"Failed to read max transaction ID for storage {registered_admin}",
    )


def test_validate_fails_for_an_unreachable_node(where: tuple[str, ...]) -> None:
    result = _run("validate", "--json", "--timeout-ms", "3000", *where)
    line = _assert_one_line_error(result, "2 of 2 endpoints failed", "Invalid hostname or port")
    report = json.loads(result.stdout)
    assert report["ok"] is False and [e["port"] for e in report["endpoints"]] == ["data", "admin"], line
    assert all(e["error"] for e in report["endpoints"])


def test_checksum_of_a_directory_that_is_not_storage(where: tuple[str, ...], tmp_path: Any) -> None:
    _assert_one_line_error(_run("checksum", str(tmp_path), *where), "is not a storage directory")


def test_ssl_config_errors_are_one_line(where: tuple[str, ...], tmp_path: Any) -> None:
    storage = f"{LOCALHOST}:{free_tcp_port()}"
    missing = tmp_path / "missing.yml"
    _assert_one_line_error(
        _run("list", "-s", storage, "--ssl-config", str(missing), *where), "config file not found"
    )
    jks = tmp_path / "ssl.yml"
    jks.write_text("server.ssl:\n  trustStore.location: /nowhere.jks\n  trustStore.type: JKS\n")
    _assert_one_line_error(_run("list", "-s", storage, "--ssl-config", str(jks), *where), "JKS")
