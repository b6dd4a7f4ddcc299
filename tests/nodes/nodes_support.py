"""Shared by the tests of nodes that come and go (issue 24): load that records what was
acknowledged, and the checks every replica move ends with."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cluster_support import run_waltz_cli, tailed

from waltz_engine.client import SyncWaltzClient, TransactionContext, WaltzClientCallbacks
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.storage.admin_ops import read_store_layout
from waltz_engine.zk.connection import connect

# The load stops by itself after this many transactions, flushing every FLUSH_EVERY.
MAX_LOAD_TRANSACTIONS = 20_000
FLUSH_EVERY = 20


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
                for i in range(MAX_LOAD_TRANSACTIONS):
                    if stop.is_set():
                        break
                    client.submit(_Append(i % partitions, f"{tag}-{i}".encode(), acknowledged))
                    if i % FLUSH_EVERY == FLUSH_EVERY - 1:
                        client.flush()
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


def cli_json(cluster: LocalCluster, *args: str) -> Any:
    done = run_waltz_cli(*args, "--json", "-c", str(cluster.client_config_path))
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def assert_replicas_caught_up_and_equal(cluster: LocalCluster) -> None:
    report = cli_json(cluster, "cluster", "under-replicated")
    assert report["under_replicated_count"] == 0, report
    done = run_waltz_cli("storage", "checksum", "--online", "--json", "-c", str(cluster.client_config_path))
    assert done.returncode == 0, (done.stdout, done.stderr)
