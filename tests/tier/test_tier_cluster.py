"""Issue 25's must-show with real processes: a dev cluster (`waltz dev up --set ...`) whose
storage nodes keep a bounded local disk over a `file://` tier. 2 000 records of 100 B go in;
each node's local files of partition 0 then take at most 100 000 bytes, its tier prefix holds
the rest, and `waltz tail -p 0 --no-follow` returns all 2 000 as appended, also once a bit is
flipped in two of the three replicas' tier copies of a segment (the whole copy serves it, the
others refuse the record by name). `waltz storage list` shows local and tier bytes, and the
replicas compare equal online over the evicted range.
`waltz spark export --tier-url` returns the same 2 000 rows, the tier's ranges read from the
object store itself: the rotten copy is the one its plan picks, so that slice ends over the
network (its summary counts the rows read from the tier and the slice that fell back)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.harness import outcomes
from cluster_support import local_cluster, run_waltz_cli, tailed, wait_serving, waltz_client_config
from storage_node_support import flip_data_bits

from spark.plan import ReadOptions, plan
from spark.tier import TierSlice
from waltz_engine.client import WaltzClient
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.online_checksum import compare_partitions
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.tier.offload import replica_name

ROTTEN = 7
RECORDS = 2_000
DATA_BYTES = 100
LOCAL_LIMIT_BYTES = 100_000
# Waits for the nodes' tier rounds (every 100 ms): POLL_S at most POLLS times (60 s).
POLL_S = 0.1
POLLS = 600


def _line(i: int) -> str:
    return f"{i:06d}-".ljust(DATA_BYTES, "x")


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tier")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str, tier: Path) -> Iterator[LocalCluster]:
    settings = {
        "storage.segment.size.threshold": 20_000,
        "storage.tier.url": tier.as_uri(),
        "storage.tier.local.bytes": 60_000,
        "storage.tier.cache.bytes": 30_000,
        "storage.tier.check.interval.ms": 100,
        # The server tells the replicas the committed prefix (their local low-water mark, the
        # bound below which segments may go to the tier) every 100 ms, not every 20 s.
        "storage.lowWaterMark.intervalMs": 100,
    }
    with local_cluster(
        tmp_path_factory, storages=3, servers=1, partitions=1, zookeeper=zookeeper, settings=settings
    ) as c:
        yield c


async def _append(cluster: LocalCluster, lines: list[str]) -> None:
    """In this process, many appends in flight (one `waltz append` waits for each in turn)."""
    contexts = [MockContext(line) for line in lines]
    async with WaltzClient(MockCallbacks(), waltz_client_config(cluster)) as client:
        for context in contexts:
            await client.submit(context)
        assert await outcomes(*contexts) == [True] * len(contexts)


def _local_bytes(cluster: LocalCluster) -> list[int]:
    return [
        sum(f.stat().st_size for f in (node.data_directory / "0").iterdir() if f.suffix in (".seg", ".idx"))
        for node in cluster.storages
    ]


def _cluster_key(tier: Path) -> uuid.UUID:
    (key,) = [d.name for d in tier.iterdir()]
    return uuid.UUID(key)


async def _refusal(cluster: LocalCluster, node: int, key: uuid.UUID) -> str:
    """What storage node ``node`` answers for the rotten record (its admin port's RECORD_LIST)."""
    storage = cluster.storages[node]
    admin = StorageAdminClient("127.0.0.1", storage.admin_port, client_context(TlsConfig()), key, 1)
    await admin.open()
    try:
        await admin.record_list(0, ROTTEN, 1)
    except WaltzError as e:
        return str(e)
    finally:
        await admin.close()
    raise AssertionError(f"storage node {node} served transaction {ROTTEN} from a damaged tier object")


def _read_options(cluster: LocalCluster, tier: Path) -> ReadOptions:
    """A Spark read of partition 0 with the tier."""
    return ReadOptions.parse(
        {"config": str(cluster.client_config_path), "partitions": "0", "tier.url": tier.as_uri()}
    )


def test_bounded_local_disk_and_reads_through_the_tier(cluster: LocalCluster, tier: Path) -> None:
    lines = [_line(i) for i in range(RECORDS)]
    asyncio.run(_append(cluster, lines))
    for _ in range(POLLS):
        if max(_local_bytes(cluster)) <= LOCAL_LIMIT_BYTES:
            break
        time.sleep(POLL_S)
    assert max(_local_bytes(cluster)) <= LOCAL_LIMIT_BYTES, _local_bytes(cluster)

    key = _cluster_key(tier)
    prefixes = [tier / str(key) / "0" / replica_name("127.0.0.1", node.port) for node in cluster.storages]
    for node, prefix in zip(cluster.storages, prefixes, strict=True):
        local = sorted(int(f.stem) for f in (node.data_directory / "0").glob("*.seg"))
        segments = json.loads((prefix / "manifest.json").read_text())["segments"]
        # The tier holds the rest: every transaction below the first local one, from 0 on.
        evicted = [s for s in segments if s["max_txid"] < local[0]]
        assert evicted and evicted[0]["first_txid"] == 0 and evicted[-1]["max_txid"] == local[0] - 1
        assert all(a["max_txid"] + 1 == b["first_txid"] for a, b in zip(evicted, evicted[1:], strict=False))
        assert not any(prefix.glob("*.part"))

    listed = run_waltz_cli("storage", "list", "-c", str(cluster.client_config_path), "--json")
    assert listed.returncode == 0, listed.stderr
    for node in json.loads(listed.stdout)["nodes"]:
        (usage,) = [p["usage"] for p in node["partitions"]]
        assert usage["local_bytes"] <= LOCAL_LIMIT_BYTES and usage["evicted_segments"] > 0, usage
        assert usage["tier_bytes"] >= usage["evicted_bytes"] > 0, usage

    # `storage checksum --online` compares the replicas over the evicted range too.
    options = _read_options(cluster, tier)
    assert options.cluster is not None
    (compared,) = compare_partitions(options.cluster, [0])
    assert compared.equal and compared.to_txid == RECORDS - 1, compared

    # The copy a Spark plan reads the rotten record from is one of the two flipped.
    (partition_plan,) = plan(options)
    tier_slices = [s for s in partition_plan.slices if isinstance(s, TierSlice)]
    (chosen,) = [s for s in tier_slices if s.from_txid <= ROTTEN <= s.to_txid]
    rotten = sorted({prefixes.index(tier / chosen.prefix), (prefixes.index(tier / chosen.prefix) + 1) % 3})
    for node in rotten:
        flip_data_bits(prefixes[node], [ROTTEN])
    # A restarted server has nothing cached: every record comes from the storage nodes.
    cluster.servers[0].restart()
    wait_serving(cluster)
    rows = tailed(cluster, [0])
    assert [r[1] for r in rows] == list(range(RECORDS))
    # One client's appends in flight commit in the order submitted, unless one is retried.
    assert sorted(bytes.fromhex(r[6]).decode() for r in rows) == lines
    for node in rotten:
        refusal = asyncio.run(_refusal(cluster, node, key))
        assert f"corrupt record: partition 0 transaction {ROTTEN}" in refusal, refusal

    output = tier.parent / "export"
    export = run_waltz_cli(
        "spark", "export", "-o", str(output), "-c", str(cluster.client_config_path), "-p", "0",
        "--tier-url", tier.as_uri(), "--json",
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    (summary,) = json.loads(export.stdout)["partitions"]
    exported = pq.read_table(output / "partition=0").sort_by("transaction_id").to_pylist()
    assert [
        (0, e["transaction_id"], e["client_id"], e["generation"], e["seq_num"], e["header"], e["data"].hex())
        for e in exported
    ] == rows
    # Every tier slice but the rotten one was read from the tier (more may be planned now:
    # the restarted server's session raised the low-water marks, more segments went up).
    assert summary["tier_fallbacks"] == 1, summary
    planned = sum(s.count for s in tier_slices)
    assert planned - chosen.count <= summary["tier_rows"] <= RECORDS - chosen.count, summary
