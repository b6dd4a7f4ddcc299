"""``waltz bench export --network``: the same generated log exported over the network and from
the local directory, in the same run, so the two rows/s are comparable on a shared machine.

The generated storage directory (:func:`spark.bench_export.generate`) becomes a live cluster:
an embedded ZooKeeper whose cluster key is the log's own (:data:`spark.bench_export.BENCH_KEY`)
and one storage node serving that very directory (every partition). No server: the network
export is given ``--to-txid``, which the node's low-water marks cover (every generated record
is committed), so the plan asks no server for the bound.

Both exports are fresh ``waltz spark export`` processes; only the reading differs: the storage
directory on the command line, or the client config and no directory. With ``--tier``, a third
export reads the same log from a ``file://`` tier (``--tier-url``, :mod:`spark.bench_tier`),
the object store in place of the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spark.bench_export import (
    BENCH_KEY,
    EXPORT_DIR_NAME,
    STORAGE_DIR_NAME,
    export,
    export_figures,
    generate,
    log_figures,
)
from spark.bench_tier import publish_tier
from waltz_engine.bench.storage_node import BenchError
from waltz_engine.ops.devcluster import HOST, LocalCluster, free_port
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.server import EmbeddedZooKeeper

CLUSTER_DIR_NAME = "cluster"
ZOOKEEPER_DIR_NAME = "zookeeper"
NETWORK_EXPORT_DIR_NAME = "export-network"
TIER_EXPORT_DIR_NAME = "export-tier"
CLUSTER_ROOT = "/waltz_bench_export"
CLUSTER_NAME = "waltz-bench-export"
ZK_SESSION_TIMEOUT_MS = 30_000
ZK_CONNECT_TIMEOUT_MS = 60_000
# One storage node holds the whole log (the generated directory). No server: the export's
# --to-txid is the bound, which the node's low-water marks cover (every record is committed).
BENCH_STORAGES = 1
BENCH_SERVERS = 0
WARM_READ_BYTES = 8 << 20


@contextlib.contextmanager
def serving(directory: Path, storage: Path, rows: int, partitions: int) -> Iterator[Path]:
    """ZooKeeper and a storage node on ``storage``, both stopped on exit; yields the client
    config's path."""
    zookeeper = EmbeddedZooKeeper(directory / ZOOKEEPER_DIR_NAME, free_port(), HOST)
    cluster_dir = directory / CLUSTER_DIR_NAME
    # The nodes' logs of the last run stay until the next; a killed run's state names dead pids.
    shutil.rmtree(cluster_dir, ignore_errors=True)
    shutil.rmtree(directory / ZOOKEEPER_DIR_NAME, ignore_errors=True)
    zookeeper.start()
    try:
        settings = ZooKeeperSettings(
            zookeeper.connect_string, CLUSTER_ROOT, ZK_SESSION_TIMEOUT_MS, ZK_CONNECT_TIMEOUT_MS
        )
        cluster = LocalCluster(
            cluster_dir,
            BENCH_STORAGES,
            BENCH_SERVERS,
            partitions,
            zookeeper=zookeeper.connect_string,
            cluster_root=CLUSTER_ROOT,
            storage_config={"storage.directory": str(storage)},
        )
        with connect(settings) as zk:
            create_cluster(zk, CLUSTER_ROOT, CLUSTER_NAME, partitions, key=BENCH_KEY)
        try:
            cluster.up()
            yield cluster.client_config_path
        finally:
            cluster.down()
    finally:
        zookeeper.stop()
        shutil.rmtree(directory / ZOOKEEPER_DIR_NAME, ignore_errors=True)


def warm_page_cache(storage: Path) -> None:
    """Read every file under ``storage`` once. The network export runs first: without this it
    would pay the disk reads of a log not read since it was generated, and the directory export
    after it would find the log in the page cache."""
    for path in sorted(storage.rglob("*")):
        if path.is_file():
            with path.open("rb", buffering=0) as f:
                while f.read(WARM_READ_BYTES):
                    pass


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _measured(
    prefix: str, run_export: Callable[[], tuple[dict[str, Any], float]], result: dict[str, Any]
) -> dict[str, Any]:
    """Run one export, adding its figures and the load average around it to ``result``."""
    before = load_average()
    summary, wall_s = run_export()
    result[f"{prefix}_load_average_before"] = before
    result[f"{prefix}_load_average_after"] = load_average()
    result |= export_figures(prefix, summary, wall_s)
    return summary


def run(
    directory: Path,
    rows: int,
    partitions: int,
    data_bytes: int,
    master: str,
    progress: Callable[[str], None] = lambda message: None,
    tier: bool = False,
) -> dict[str, Any]:
    """Generate (or reuse) the log, serve it, export it over the network (then from a tier
    holding it, with ``tier``) then locally."""
    if rows % partitions:
        raise BenchError(f"--network needs rows ({rows}) a multiple of partitions ({partitions})")
    storage = directory / STORAGE_DIR_NAME
    progress(f"log of {rows:,} transactions x {data_bytes} B over {partitions} partitions")
    generate_s = generate(storage, rows, partitions, data_bytes)
    result = log_figures(rows, partitions, data_bytes, master, generate_s) | {"cpus": os.cpu_count()}
    progress("reading the log once, so that both exports find it in the page cache")
    warm_page_cache(storage)
    progress("starting ZooKeeper and a storage node on the log")
    with serving(directory, storage, rows, partitions) as client_config:
        progress(f"waltz spark export --master {master} over the network")
        to_txid = str(rows // partitions - 1)
        network = _measured(
            "network",
            lambda: export(
                None,
                directory / NETWORK_EXPORT_DIR_NAME,
                master,
                ["--config", str(client_config), "--to-txid", to_txid],
            ),
            result,
        )
        if tier:
            progress("copying the log's segments into a file:// tier")
            url, publish_s = publish_tier(storage, directory)
            result["tier_publish_s"] = round(publish_s, 3)
            progress(f"waltz spark export --master {master} from the tier")
            from_tier = _measured(
                "tier",
                lambda: export(
                    None,
                    directory / TIER_EXPORT_DIR_NAME,
                    master,
                    ["--config", str(client_config), "--to-txid", to_txid, "--tier-url", url],
                ),
                result,
            )
            result["tier_rows"] = sum(p["tier_rows"] for p in from_tier["partitions"])
            result["tier_vs_network"] = round(from_tier["rows_per_s"] / network["rows_per_s"], 3)
        progress(f"waltz spark export --master {master} from the directory")
        local = _measured("local", lambda: export(storage, directory / EXPORT_DIR_NAME, master), result)
        result["network_vs_local"] = round(network["rows_per_s"] / local["rows_per_s"], 3)
    for name in (NETWORK_EXPORT_DIR_NAME, TIER_EXPORT_DIR_NAME):
        shutil.rmtree(directory / name, ignore_errors=True)
    return result
