"""`waltz storage` admin commands against real storage node processes and a real ZooKeeper.

Two nodes, A and B, serve one 4-partition cluster for the whole module; both are registered
in ZooKeeper (group 0 and 1). A holds every partition; each test uses the partitions of B
it needs and says which. The recovery test stops both nodes to compare the copies' CRC-32
and starts them again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_node_support import (
    StorageNodeProcess,
    client_ssl,
    create_test_cluster,
    directory_digest,
    make_records,
)
from typer.testing import CliRunner, Result

from waltz_cli.main import app
from waltz_engine.common.address import HostPort
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.admin_ops import (
    SESSION_CHANGE_ATTEMPTS,
    StorageAdminError,
    StorageContext,
    max_transaction_id,
)
from waltz_engine.storage.admin_ops.layout import read_store_layout
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.replica_mover import COPY_BATCH_SIZE, ReplicaMover
from waltz_engine.zk import replica_moves, store_metadata
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.replica_moves import ReplicaMove

NUM_PARTITIONS = 4
SESSION_ID = 7
SEGMENT_NAME = "0000000000000000000.seg"
RECORD_DATA_SIZE_BYTES = 32  # make_records' default

runner = CliRunner()


class Cluster:
    def __init__(self, zookeeper: str, root: str, a: StorageNodeProcess, b: StorageNodeProcess) -> None:
        self.zookeeper = zookeeper
        self.root = root
        self.a = a
        self.b = b

    @property
    def where(self) -> tuple[str, ...]:
        return ("-z", self.zookeeper, "-r", self.root)

    def run(self, *args: str) -> Result:
        return runner.invoke(app, ["storage", *args, *self.where])

    def ok(self, *args: str) -> Result:
        result = self.run(*args)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result


def admin(node: StorageNodeProcess) -> str:
    return f"{node.host}:{node.admin_port}"


def data(node: StorageNodeProcess) -> str:
    """The node's data address, as registered in ZooKeeper: what -s takes first."""
    return f"{node.host}:{node.port}"


def _assert_one_line_error(result: Result, *fragments: str) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root, key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    work = tmp_path_factory.mktemp("storage-admin")
    a = StorageNodeProcess(zookeeper, root, key, NUM_PARTITIONS, work / "a", jetty=False)
    b = StorageNodeProcess(zookeeper, root, key, NUM_PARTITIONS, work / "b", jetty=False)
    try:
        a.start()
        b.start()
        a.assign()
        with connect(ZooKeeperSettings(zookeeper, root)) as client:
            for group, node in enumerate((a, b)):
                storage = f"{node.host}:{node.port}"
                store_metadata.add_storage_node(client, root, storage, group, node.admin_port)
        yield Cluster(zookeeper, root, a, b)
    finally:
        a.close()
        b.close()


def _partitions(result: Result) -> dict[int, dict[str, Any]]:
    nodes = json.loads(result.stdout)["nodes"]
    assert len(nodes) == 1
    return {p["partition_id"]: p for p in nodes[0]["partitions"]}


async def _write(
    node: StorageNodeProcess, partition_id: int, first: int, count: int, lwm: int | None
) -> None:
    """Append records through a data client with SESSION_ID; then persist a low-water mark."""
    client = node.data_client()
    await client.open()
    try:
        await client.append(SESSION_ID, partition_id, make_records(first, count, partition_id))
        if lwm is not None:
            await client.set_low_water_mark(SESSION_ID, partition_id, lwm)
    finally:
        await client.close()


async def _moved_bytes(node: StorageNodeProcess, partition_id: int, count: int) -> int:
    """The size of the node's first ``count`` records of the partition (all there), each whole:
    what a copy moves."""
    client = node.admin_client()
    await client.open()
    try:
        records = await client.record_list(partition_id, 0, count + 1)
    finally:
        await client.close()
    assert [r.transaction_id for r in records] == list(range(count))
    return sum(RECORD_OVERHEAD_BYTES + len(r.data) for r in records)


# --- list --------------------------------------------------------------------------------------


def test_list_one_node_and_all_nodes(cluster: Cluster) -> None:
    a_parts = _partitions(cluster.ok("list", "-s", data(cluster.a), "--json"))
    assert sorted(a_parts) == list(range(NUM_PARTITIONS))
    assert all(p["is_assigned"] and p["is_available"] for p in a_parts.values())
    # The original's form, the admin address, names the same node.
    by_admin = json.loads(cluster.ok("list", "-s", admin(cluster.a), "--json").stdout)["nodes"]
    assert [(n["storage"], n["admin"]) for n in by_admin] == [(data(cluster.a), admin(cluster.a))]
    assert {p["partition_id"]: p for p in by_admin[0]["partitions"]}.keys() == a_parts.keys()

    every = json.loads(cluster.ok("list", "--json").stdout)["nodes"]
    assert sorted((n["storage"], n["admin"]) for n in every) == sorted(
        [(data(cluster.a), admin(cluster.a)), (data(cluster.b), admin(cluster.b))]
    )

    text = cluster.ok("list", "-s", data(cluster.a)).stdout
    assert f"partitions at {data(cluster.a)} (admin {admin(cluster.a)})" in text
    for column in ("partition", "session", "assigned", "available"):
        assert column in text


# --- add / remove ----------------------------------------------------------------------------------


def test_add_and_remove_partitions_keeps_files_unless_asked(cluster: Cluster) -> None:
    """B: partitions 2 and 3."""
    b = cluster.b
    cluster.ok("add-partition", "-s", data(b), "-p", "2-3")
    listed = _partitions(cluster.ok("list", "-s", admin(b), "--json"))
    assert {2, 3} <= set(listed) and listed[2]["is_assigned"] and listed[3]["is_assigned"]
    segments = {p: b.directory / str(p) / SEGMENT_NAME for p in (2, 3)}
    assert all(path.is_file() for path in segments.values())

    removed = cluster.ok("remove-partition", "-s", admin(b), "-p", "2").stdout
    assert "segment files kept" in removed
    assert segments[2].is_file()
    cluster.ok("remove-partition", "-s", admin(b), "-p", "3", "--delete-storage-files")
    assert not segments[3].exists()
    listed = _partitions(cluster.ok("list", "-s", admin(b), "--json"))
    assert not any(listed.get(p, {}).get("is_assigned") for p in (2, 3)), listed


# --- availability ----------------------------------------------------------------------------------


def test_availability_off_makes_appends_fail_with_the_nodes_message(cluster: Cluster) -> None:
    """A: partition 1."""
    a = cluster.a
    cluster.ok("availability", "-s", data(a), "-p", "1", "--offline")
    assert not _partitions(cluster.ok("list", "-s", admin(a), "--json"))[1]["is_available"]
    with pytest.raises(StorageRpcError, match="read and write for partition=1 have been disabled"):
        a.run(_write(a, 1, 0, 1, None))

    cluster.ok("availability", "-s", admin(a), "-p", "1", "--online")
    assert _partitions(cluster.ok("list", "-s", admin(a), "--json"))[1]["is_available"]
    a.run(_write(a, 1, 0, 3, 2))


# --- max transaction id ----------------------------------------------------------------------------


def test_max_transaction_id_online_and_offline(cluster: Cluster) -> None:
    """A: partition 3."""
    a = cluster.a
    a.run(_write(a, 3, 0, 5, 4))
    base = ("max-transaction-id", "-s", data(a), "-p", "3")
    assert cluster.ok(*base).stdout.strip() == "Max Transaction ID: 4"
    # The original's form: the admin address and the data port (-sp, a hidden alias).
    original = ("max-transaction-id", "-s", admin(a), "-sp", str(a.port), "-p", "3")
    assert cluster.ok(*original).stdout.strip() == "Max Transaction ID: 4"
    by_admin = cluster.ok("max-transaction-id", "-s", admin(a), "-p", "3")  # data port from ZooKeeper
    assert by_admin.stdout.strip() == "Max Transaction ID: 4"

    # Offline mode needs the partition unavailable: the node's own message says so.
    _assert_one_line_error(
        cluster.run(*base, "--offline"), "Failed to read max transaction ID", "while partition is online"
    )
    cluster.ok("availability", "-s", data(a), "-p", "3", "--offline")
    try:
        # A check: the node's files are as they were after it (issue 31).
        before = directory_digest(a.directory)
        as_json = json.loads(cluster.ok(*base, "--offline", "--json").stdout)
        assert directory_digest(a.directory) == before
        assert as_json == {
            "storage": data(a),
            "admin": admin(a),
            "partition_id": 3,
            "max_transaction_id": 4,
        }
    finally:
        cluster.ok("availability", "-s", data(a), "-p", "3", "--online")


def test_max_transaction_id_reads_a_session_that_changed_meanwhile_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery can open a new session between LAST_SESSION_INFO and MAX_TRANSACTION_ID (the
    node then refuses the stale session): the session is read again, a bounded number of times."""
    a = cluster.a
    a.run(_write(a, 2, 0, 3, 2))  # the low-water mark persists session SESSION_ID
    stale_reads = {"left": 1}
    real = StorageAdminClient.last_session_info

    async def sometimes_stale(self: StorageAdminClient, partition_id: int) -> Any:
        info = await real(self, partition_id)
        if stale_reads["left"] > 0:
            stale_reads["left"] -= 1
            return info._replace(session_id=info.session_id - 1)  # what it was before the new session
        return info

    monkeypatch.setattr(StorageAdminClient, "last_session_info", sometimes_stale)
    context = StorageContext(a.key, NUM_PARTITIONS, client_ssl())
    address = HostPort(a.host, a.admin_port)
    assert a.run(max_transaction_id(context, address, a.port, 2, offline=False)) == 2

    stale_reads["left"] = SESSION_CHANGE_ATTEMPTS  # stale every time: a clear error, no endless loop
    with pytest.raises(StorageAdminError, match="session id has changed"):
        a.run(max_transaction_id(context, address, a.port, 2, offline=False))
    assert stale_reads["left"] == 0


# --- validate --------------------------------------------------------------------------------------


def test_validate_passes_for_running_nodes(cluster: Cluster) -> None:
    report = json.loads(cluster.ok("validate", "--json").stdout)
    assert report["ok"] is True
    assert sorted((e["port"], e["address"]) for e in report["endpoints"]) == sorted(
        [
            ("admin", admin(cluster.a)),
            ("admin", admin(cluster.b)),
            ("data", f"{cluster.a.host}:{cluster.a.port}"),
            ("data", f"{cluster.b.host}:{cluster.b.port}"),
        ]
    )
    assert "storage node connectivity" in cluster.ok("validate").stdout


# --- recovery and replica checksums ----------------------------------------------------------------


def _checksums(cluster: Cluster, node: StorageNodeProcess) -> dict[int, int]:
    result = cluster.ok("checksum", str(node.directory), "-p", "0", "--json")
    return {c["partition_id"]: c["checksum"] for c in json.loads(result.stdout)["checksums"]}


def test_recover_partition_copies_up_to_the_sources_local_low_water_mark(cluster: Cluster) -> None:
    """A → B: partition 0."""
    a, b = cluster.a, cluster.b
    a.run(_write(a, 0, 0, 250, 249))  # local low-water mark 249
    a.run(_write(a, 0, 250, 10, None))  # beyond it: not copied
    cluster.ok("add-partition", "-s", admin(b), "-p", "0")
    recover = ("recover-partition", "-s", data(a), "--destination-storage", data(b), "-p", "0", "-b", "7")
    # The original's form: admin addresses, the destination's data port, multi-letter flags.
    original: tuple[str, ...] = (
        "recover-partition",
        "--source-storage",
        admin(a),
        "--destination-storage",
        admin(b),
    )
    original += ("-dp", str(b.port), "-p", "0", "-b", "7")

    # The destination's copy must be offline first; the node's own message says why not.
    _assert_one_line_error(
        cluster.run(*recover), "Partition 0 failed to recover", "while partition is online"
    )

    cluster.ok("availability", "-s", data(b), "-p", "0", "--offline")
    result = cluster.ok(*recover, "--json")
    report = json.loads(result.stdout)
    assert (report["start"], report["target"], report["max_transaction_id"]) == (-1, 249, 249)
    assert report["records_copied"] == 250
    assert "partition 0: destination at 249 of 249" in result.stderr  # plain progress off a TTY
    offline_max = ("max-transaction-id", "-s", data(b), "-p", "0", "--offline")
    assert cluster.ok(*offline_max).stdout.strip() == "Max Transaction ID: 249"

    # A moves its low-water mark on; a second run catches up from B's own low-water mark.
    a.run(_write(a, 0, 260, 5, 264))
    report = json.loads(cluster.ok(*original, "--json").stdout)
    assert (report["start"], report["target"], report["records_copied"]) == (249, 264, 15)
    assert cluster.ok(*offline_max).stdout.strip() == "Max Transaction ID: 264"

    # Checksums need the nodes stopped (the control file is locked while one runs).
    _assert_one_line_error(cluster.run("checksum", str(a.directory)), "in use by another process")
    a.terminate()
    b.terminate()
    try:
        a_sums, b_sums = _checksums(cluster, a), _checksums(cluster, b)
        assert a_sums == b_sums and set(a_sums) == {0}
        _assert_one_line_error(
            cluster.run("checksum", str(b.directory), "-p", "1"), "partition 1 is not assigned"
        )
    finally:
        a.start()
        b.start()
    cluster.ok("availability", "-s", data(b), "-p", "0", "--online")

    # Back from B to A, which holds 265..269 above both low-water marks (264): they may be
    # committed copies a quorum needs, so the cut is refused unless asked for.
    a.run(_write(a, 0, 265, 5, None))
    a_max = ("max-transaction-id", "-s", data(a), "-p", "0", "--offline")
    back = ("recover-partition", "-s", data(b), "--destination-storage", data(a), "-p", "0", "--json")
    cluster.ok("availability", "-s", data(a), "-p", "0", "--offline")
    try:
        _assert_one_line_error(cluster.run(*back), "Partition 0", "would remove 265..269", "--refill-only")
        assert cluster.ok(*a_max).stdout.strip() == "Max Transaction ID: 269"
        report = json.loads(cluster.ok(*back, "--refill-only").stdout)
        assert (report["max_transaction_id"], report["records_copied"]) == (269, 0)
        report = json.loads(cluster.ok(*back, "--force").stdout)
        assert (report["start"], report["max_transaction_id"]) == (264, 264)
        assert cluster.ok(*a_max).stdout.strip() == "Max Transaction ID: 264"
    finally:
        cluster.ok("availability", "-s", data(a), "-p", "0", "--online")


def test_a_replica_move_copies_the_tail_appended_meanwhile_at_the_same_rate(cluster: Cluster) -> None:
    """A → B: partition 1. While the first pass copies, A takes more records than one batch: a
    second pass copies them through the same rate limit, before the copy goes online."""
    a, b = cluster.a, cluster.b
    context = StorageContext(a.key, NUM_PARTITIONS, client_ssl())
    start = 1 + a.run(max_transaction_id(context, HostPort(a.host, a.admin_port), a.port, 1, offline=False))
    first, tail = COPY_BATCH_SIZE + 1, COPY_BATCH_SIZE + 1
    a.run(_write(a, 1, start, first, start + first - 1))
    limited: list[int] = []  # the data bytes of each batch the limiter was asked about
    said: list[str] = []

    class Mover(ReplicaMover):
        async def throttle(self, size_bytes: int) -> None:
            limited.append(size_bytes)
            if len(limited) == 1:  # appends go on while the first pass copies
                await _write(a, 1, start + first, tail, start + first + tail - 1)

    with connect(ZooKeeperSettings(cluster.zookeeper, cluster.root)) as zk:
        layout = read_store_layout(zk, cluster.root)
        assert replica_moves.try_lease(zk, cluster.root, "test mover")  # a mover checks it before each change
        mover = Mover(zk, cluster.root, layout.context(client_ssl()), bytes_per_second=1, say=said.append)
        b.run(mover.copy(layout, ReplicaMove(1, data(a), data(b))))
    try:
        assert sum(limited) == b.run(_moved_bytes(b, 1, start + first + tail))
        assert max(limited) <= COPY_BATCH_SIZE * (RECORD_OVERHEAD_BYTES + RECORD_DATA_SIZE_BYTES)
        tail_passes = [line for line in said if "copying the tail appended meanwhile" in line]
        assert len(tail_passes) == 2 and f"from {start + first} at most 1 bytes/s" in tail_passes[0], said
        online = max_transaction_id(context, HostPort(b.host, b.admin_port), b.port, 1, offline=False)
        assert b.run(online) == start + first + tail - 1
    finally:
        cluster.ok("remove-partition", "-s", admin(b), "-p", "1", "--delete-storage-files")


# --- sync-partitions (its own cluster: it rewrites what nodes hold) --------------------------------


def test_sync_partitions_follows_zookeeper(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    node = StorageNodeProcess(zookeeper, root, key, NUM_PARTITIONS, tmp_path / "sync", jetty=False)
    storage = f"{node.host}:{node.port}"
    with node:
        node.start()
        node.assign([3])  # held, but ZooKeeper will not say so
        with connect(ZooKeeperSettings(zookeeper, root)) as client:
            store_metadata.add_storage_node(client, root, storage, 0, node.admin_port)
            store_metadata.assign_partitions(client, root, storage, [0, 2])
        sync_cluster = Cluster(zookeeper, root, node, node)

        first = json.loads(sync_cluster.ok("sync-partitions", "--json").stdout)["nodes"]
        assert first == [{"storage": storage, "admin": admin(node), "assigned": [0, 2], "unassigned": [3]}]
        listed = _partitions(sync_cluster.ok("list", "-s", admin(node), "--json"))
        assigned = sorted(p for p, info in listed.items() if info["is_assigned"])
        assert assigned == [0, 2]
        assert (node.directory / "3" / SEGMENT_NAME).is_file()  # un-assigned, files kept

        second = sync_cluster.ok("sync-partitions").stdout
        assert f"{storage} (admin {admin(node)}): assigned none, un-assigned none" in second
