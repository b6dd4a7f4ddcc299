"""Retention with real processes: ZooKeeper, 3 storage nodes, a server, a client.

One flow on one cluster (each step needs the previous one's log): the cleaner removes only the
eligible head segments on all three replicas (first only up to an export's watermark, then up
to the bound), reads below the retained start fail with a message naming it, a storage node
restarts on its retained log, a replica whose disk was replaced is filled from the retained
start and matches the others, and `waltz inspect verify` passes on every retained log.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from client_support.app import MockCallbacks, MockContext
from cluster_support import local_cluster, waltz_client_config
from typer.testing import CliRunner

from waltz_cli.commands import inspect as inspect_cli
from waltz_cli.commands import retention as retention_cli
from waltz_engine.client import WaltzClient
from waltz_engine.common.address import HostPort
from waltz_engine.common.record import Record
from waltz_engine.ops.devcluster import LocalCluster, LocalNode
from waltz_engine.ops.online_checksum import compare_partitions
from waltz_engine.storage.admin_ops import (
    StorageContext,
    add_partitions,
    admin_client,
    client_ssl_context,
    read_store_layout,
)
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.zk.connection import connect
from waltz_engine.zk.export_watermarks import exports_path
from waltz_engine.zk.java_io import DataWriter
from waltz_engine.zk.retention import removable_head_segments, retained_start_in

PARTITION = 0
SEGMENT_THRESHOLD_BYTES = 2048
RETENTION_CHECK_INTERVAL_MS = 300
# How often the server tells the replicas the committed prefix (20 s by default).
LOW_WATER_MARK_INTERVAL_MS = 200
DATA_BYTES = 100
NUM_TRANSACTIONS = 60
COMMIT_TIMEOUT_S = 60.0
WAIT_TIMEOUT_S = 90.0
POLL_S = 0.2
ADMIN_TIMEOUT_MS = 10_000
EXPORT_ID = "spark-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> object:
    storage_config = {
        "storage.segment.size.threshold": SEGMENT_THRESHOLD_BYTES,
        "storage.retention.check.interval.ms": RETENTION_CHECK_INTERVAL_MS,
    }
    with local_cluster(
        tmp_path_factory,
        storages=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper,
        storage_config=storage_config,
        server_config={"storage.lowWaterMark.intervalMs": LOW_WATER_MARK_INTERVAL_MS},
    ) as c:
        yield c


def _partition_dir(node: LocalNode) -> Path:
    return node.directory / "data" / str(PARTITION)


def _segment_firsts(node: LocalNode) -> list[int]:
    return sorted(int(p.stem) for p in _partition_dir(node).glob("*.seg"))


def _expected_firsts(firsts: list[int], max_txid: int, limit: int) -> list[int]:
    """The first txids left after removing what ``limit`` allows (everything committed)."""
    spans = [(f, n - 1) for f, n in zip(firsts, [*firsts[1:], max_txid + 1], strict=True)]
    return firsts[removable_head_segments(spans, limit, max_txid) :]


def _wait_for(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def _context(cluster: LocalCluster) -> StorageContext:
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    return layout.context(client_ssl_context(None), ADMIN_TIMEOUT_MS)


# One application state for the whole flow: a client mounting from scratch would need the
# records that retention removes (its feed starts after its high-water mark).
APPLICATION = MockCallbacks()


async def _commit_many(cluster: LocalCluster, count: int) -> None:
    client = await WaltzClient.create(APPLICATION, waltz_client_config(cluster))
    try:
        for i in range(count):
            context = MockContext(f"{i:03d}".ljust(DATA_BYTES, "x"), partition=PARTITION)
            await client.submit(context)
            assert await context.result(COMMIT_TIMEOUT_S)
    finally:
        await client.close()


async def _records(context: StorageContext, node: LocalNode, first: int, count: int) -> list[Record]:
    async with admin_client(context, HostPort("127.0.0.1", node.admin_port)) as admin:
        return await admin.record_list(PARTITION, first, count)


async def _gauge(context: StorageContext, node: LocalNode, name: str) -> int | None:
    async with admin_client(context, HostPort("127.0.0.1", node.admin_port)) as admin:
        gauges = (await admin.metrics())["gauges"]
    entry = gauges.get(f"waltz-storage.partition-{PARTITION}.{name}")
    return None if entry is None else entry["value"]


def _wait_all_at(cluster: LocalCluster, context: StorageContext, name: str, at_least: int) -> None:
    for node in cluster.storages:
        _wait_for(
            f"{node.name} {name} >= {at_least}",
            lambda node=node: (asyncio.run(_gauge(context, node, name)) or -1) >= at_least,  # type: ignore[misc]
        )


def _cli(cluster: LocalCluster, *args: str) -> str:
    result = CliRunner().invoke(
        retention_cli.app, [*args, "-z", cluster.zookeeper, "-r", cluster.cluster_root]
    )
    assert result.exit_code == 0, result.output
    return result.output


def _check_refusal_and_dry_run(
    cluster: LocalCluster,
    firsts: dict[str, list[int]],
    last: int,
    bound: int,
    watermark: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bound above the high-water mark + 1 is refused without --force; --dry-run changes nothing
    and lists, per replica as its node reports it, the segments below the export's watermark + 1."""
    where = ["-z", cluster.zookeeper, "-r", cluster.cluster_root]
    too_high = CliRunner().invoke(
        retention_cli.app, ["set", "-p", str(PARTITION), "--before", "999999", *where]
    )
    assert too_high.exit_code == 1
    assert too_high.stderr == (
        f"error: --before 999999 is above partition {PARTITION}'s committed high-water mark {last}: "
        f"records {last + 1}..999998 would go as soon as they are written "
        f"(give --before {last + 1} at most, or --force)\n"
    )
    # The dry run reads the cluster the environment names from its nodes, over the network: a
    # `.waltz-dev` of another cluster in the working directory is not read (issue 31).
    other = tmp_path / ".waltz-dev"
    (other / "storage-0" / "data" / str(PARTITION)).mkdir(parents=True)
    (other / "client.yml").write_text(
        f"zookeeper.connectString: {cluster.zookeeper}\ncluster.root: /elsewhere\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WALTZ_CONFIG", str(cluster.client_config_path))
    storages = [node.connect_string for node in cluster.storages]
    for before in (str(bound), "999999"):
        result = CliRunner().invoke(
            retention_cli.app, ["set", "-p", str(PARTITION), "--before", before, "--dry-run", "--force"]
        )
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0] == (
            f"dry run, nothing changed: partition {PARTITION}: records below {before} could be removed "
            f"(exports keep what they have not read: below {watermark + 1} only)"
        )
        expected_lines = []
        for node in cluster.storages:
            kept = _expected_firsts(firsts[node.name], last, watermark + 1)
            going = [f for f in firsts[node.name] if f < kept[0]]
            ranges = ", ".join(f"{f}..{n - 1}" for f, n in zip(going, [*going[1:], kept[0]], strict=True))
            expected_lines.append(f"{node.connect_string}: segments that may go now: {ranges}")
        assert sorted(lines[1:]) == sorted(expected_lines), (storages, lines)
    monkeypatch.undo()
    assert '"bound": null' in _cli(cluster, "show", "--json")  # nothing was set


def test_retention_end_to_end(cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    context = _context(cluster)
    asyncio.run(_commit_many(cluster, NUM_TRANSACTIONS))
    last = NUM_TRANSACTIONS - 1
    # Only records below a replica's local low-water mark + 1 are known committed: the running
    # store session tells every replica its committed prefix (no restart, no new session).
    _wait_all_at(cluster, context, "local-low-water-mark", last)

    firsts = {node.name: _segment_firsts(node) for node in cluster.storages}
    assert all(len(f) >= 5 for f in firsts.values()), firsts
    reference = firsts[cluster.storages[0].name]
    bound = reference[3] + 1  # inside the fourth segment: that one stays
    watermark = reference[1] + 3  # the export has taken less: only up to it may go

    with connect(cluster.zookeeper_settings()) as zk:
        payload = DataWriter().write_int8(1).write_int32(1).write_int32(PARTITION).write_int64(watermark)
        zk.create(f"{exports_path(cluster.cluster_root)}/{EXPORT_ID}", payload.to_bytes(), makepath=True)
    _check_refusal_and_dry_run(cluster, firsts, last, bound, watermark, tmp_path, monkeypatch)
    _cli(cluster, "set", "--partition", str(PARTITION), "--before", str(bound))
    for node in cluster.storages:
        expected = _expected_firsts(firsts[node.name], last, watermark + 1)
        assert expected[0] == reference[1]  # the watermark's segment and all above stay
        _wait_for(f"{node.name} down to the export", lambda n=node, e=expected: _segment_firsts(n) == e)  # type: ignore[misc]

    with connect(cluster.zookeeper_settings()) as zk:
        zk.delete(f"{exports_path(cluster.cluster_root)}/{EXPORT_ID}")
    for node in cluster.storages:
        expected = _expected_firsts(firsts[node.name], last, bound)
        assert expected == firsts[node.name][3:]  # exactly below the bound's segment
        _wait_for(f"{node.name} down to the bound", lambda n=node, e=expected: _segment_firsts(n) == e)  # type: ignore[misc]
        assert not [p for f in firsts[node.name][:3] for p in _partition_dir(node).glob(f"{f:019d}.*")]
    start = reference[3]
    assert '"effective_bound": ' + str(bound) in _cli(cluster, "show", "--json")
    assert f"={start}" in _cli(cluster, "show")

    # Reads below the retained start fail, naming it; reads from it work.
    for node in cluster.storages:
        with pytest.raises(StorageRpcError) as below:
            asyncio.run(_records(context, node, start - 1, 1))
        assert retained_start_in(str(below.value)) == start, str(below.value)
        assert [r.transaction_id for r in asyncio.run(_records(context, node, start, 2))] == [
            start,
            start + 1,
        ]
    # Readers of the whole log over the network start at the retained start by themselves.
    (compared,) = compare_partitions(ClusterAccess(cluster.zookeeper_settings()), [PARTITION])
    assert compared.equal and (compared.from_txid, compared.to_txid) == (start, last), compared

    # A storage node restarts on its retained log and keeps serving.
    cluster.storages[0].restart()
    asyncio.run(_commit_many(cluster, 3))
    last += 3
    _wait_all_at(cluster, context, "max-transaction-id", last)
    assert _segment_firsts(cluster.storages[0])[0] == start

    # The bound lowered after the cleaners acted on it (an application's consumed position
    # moved back, say): what went stays gone, and the highest bound set stays on record.
    lowered = _cli(cluster, "set", "--partition", str(PARTITION), "--before", "1")
    assert f"a bound of {bound} was set before" in lowered, lowered
    shown = json.loads(_cli(cluster, "show", "--json"))["partitions"][PARTITION]
    assert (shown["bound"], shown["highest_bound"]) == (1, bound), shown

    # A replica whose disk was replaced: nobody has the records below the retained start any
    # more, so it is filled from there (allowed by the highest bound ever set, the current one
    # being lower: before, every store session failed on the refused late start, issue 32).
    replaced = cluster.storages[2]
    replaced.stop()
    shutil.rmtree(replaced.directory / "data")
    replaced.start()
    asyncio.run(add_partitions(context, HostPort("127.0.0.1", replaced.admin_port), [PARTITION]))
    asyncio.run(_commit_many(cluster, 5))
    last += 5
    _wait_all_at(cluster, context, "max-transaction-id", last)
    assert _segment_firsts(replaced)[0] == start
    assert asyncio.run(_gauge(context, replaced, "first-transaction-id")) == start
    count = last - start + 1
    logs = [asyncio.run(_records(context, node, start, count)) for node in cluster.storages]
    assert len(logs[0]) == count
    assert logs[2] == logs[0] == logs[1]

    # Offline checks of every retained log.
    for node in cluster.storages:
        node.stop()
    for node in cluster.storages:
        result = CliRunner().invoke(inspect_cli.app, ["verify", str(node.directory / "data")])
        assert result.exit_code == 0, result.output
