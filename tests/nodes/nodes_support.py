"""Shared by the tests of nodes that come and go (issue 24): load that records what was
acknowledged, and the checks every replica move ends with."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cluster_support import run_waltz_cli, tailed

from waltz_engine.client import SyncWaltzClient, TransactionContext, WaltzClientCallbacks
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.storage.admin_ops import client_ssl_context, list_partitions, read_store_layout
from waltz_engine.zk.connection import connect

# The load stops by itself after this many transactions, flushing every FLUSH_EVERY, at most
# LOAD_PER_S a second: enough to keep every partition writing, not enough to take the CPU the
# nodes need to move replicas.
MAX_LOAD_TRANSACTIONS = 20_000
FLUSH_EVERY = 20
LOAD_PER_S = 50


class _Append(TransactionContext):
    def __init__(self, partition: int, data: bytes, acknowledged: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self._partition = partition
        self._data = data
        self._acknowledged = acknowledged

    def partition_id(self, num_partitions: int) -> int:
        return self._partition % num_partitions

    def execute(self, builder: Any) -> bool:
        builder.set_transaction_data(self._data)
        return True

    def on_completion(self, result: bool) -> None:
        if result:
            self._acknowledged.append((self._partition, self._data))


class _NoFeed(WaltzClientCallbacks):
    def get_client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction: Any) -> None:
        pass


@contextmanager
def load(cluster: LocalCluster, partitions: int, tag: str) -> Iterator[list[tuple[int, bytes]]]:
    """Appends run on a thread while the block runs; yields the (partition, data) acknowledged."""
    acknowledged: list[tuple[int, bytes]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with SyncWaltzClient(_NoFeed(), str(cluster.client_config_path)) as client:
                started = time.monotonic()
                for i in range(MAX_LOAD_TRANSACTIONS):
                    client.submit(_Append(i % partitions, f"{tag}-{i}".encode(), acknowledged))
                    if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                        client.flush()
                        # Paced: wait for the next batch's time, or the end of the block.
                        if stop.wait(max(0.0, started + (i + 1) / LOAD_PER_S - time.monotonic())):
                            break
                client.flush()
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors.append(e)

    thread = threading.Thread(target=run, name=f"load-{tag}")
    thread.start()
    try:
        yield acknowledged
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert acknowledged, "the load appended nothing"


def assert_nothing_lost(
    cluster: LocalCluster, partitions: int, acknowledged: list[tuple[int, bytes]]
) -> None:
    held = {(row[0], bytes.fromhex(row[6])) for row in tailed(cluster, range(partitions))}
    lost = [a for a in acknowledged if a not in held]
    assert not lost, f"{len(lost)} acknowledged transactions lost, e.g. {lost[:3]}"


def replica_sets(cluster: LocalCluster) -> dict[int, set[str]]:
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    sets: dict[int, set[str]] = {p: set() for p in range(layout.num_partitions)}
    for storage, ids in layout.assignments.items():
        for p in ids:
            sets[p].add(storage)
    return sets


def node_holds(cluster: LocalCluster, storage: str) -> list[int]:
    """The partitions a storage node says it holds assigned (admin METRICS), asked in-process."""
    with connect(cluster.zookeeper_settings()) as zk:
        layout = read_store_layout(zk, cluster.cluster_root)
    context = layout.context(client_ssl_context(None))
    node = asyncio.run(list_partitions(context, layout.admin_address(storage), storage))
    return [s.partition_id for s in node.partitions if s.is_assigned]


def cli_json(cluster: LocalCluster, *args: str) -> Any:
    done = run_waltz_cli(*args, "--json", "-c", str(cluster.client_config_path))
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def assert_replicas_caught_up_and_equal(cluster: LocalCluster) -> None:
    report = cli_json(cluster, "cluster", "under-replicated")
    assert report["under_replicated_count"] == 0, report
    done = run_waltz_cli("storage", "checksum", "--online", "--json", "-c", str(cluster.client_config_path))
    assert done.returncode == 0, (done.stdout, done.stderr)
