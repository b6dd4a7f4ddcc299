"""Shared by the tests of nodes that come and go (issue 24): load that records what was
acknowledged, and the checks every replica move ends with."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from cluster_support import CLI_TIMEOUT_S, run_cli_each, run_waltz_cli, waltz_cli_command

from waltz_engine.client import SyncWaltzClient, TransactionContext, WaltzClientCallbacks
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.storage.admin_ops import client_ssl_context, list_partitions, read_store_layout
from waltz_engine.storage.network_reader import ClusterAccess, discover, read_slice_records
from waltz_engine.zk.connection import connect

# The load stops by itself after this many transactions, flushing every FLUSH_EVERY, at most
# LOAD_PER_S a second: enough to keep every partition writing, not enough to take the CPU the
# nodes need to move replicas.
MAX_LOAD_TRANSACTIONS = 20_000
FLUSH_EVERY = 20
LOAD_PER_S = 50
# How long, and how often, a test asks `waltz cluster under-replicated` until it reports none.
UNDER_REPLICATED_WAIT_S = 60.0
UNDER_REPLICATED_POLL_S = 0.2


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


def _append(
    client: SyncWaltzClient, partitions: int, tag: str, i: int, acknowledged: list[tuple[int, bytes]]
) -> None:
    client.submit(_Append(i % partitions, f"{tag}-{i}".encode(), acknowledged))


def preload(cluster: LocalCluster, partitions: int, per_partition: int, size_bytes: int) -> None:
    """``per_partition`` transactions of ``size_bytes`` on each partition, appended in-process."""
    acknowledged: list[tuple[int, bytes]] = []
    with SyncWaltzClient(_NoFeed(), str(cluster.client_config_path)) as client:
        for i in range(partitions * per_partition):
            _append(client, partitions, "preload".ljust(size_bytes, "-"), i, acknowledged)
        client.flush()
    assert len(acknowledged) == partitions * per_partition, len(acknowledged)


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
                    _append(client, partitions, tag, i, acknowledged)
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
    """Every acknowledged transaction is in the committed log, read in-process from the
    replicas (up to the servers' committed high-water marks)."""
    layout = discover(ClusterAccess(cluster.zookeeper_settings()), range(partitions))
    held = set()
    for p, sources in layout.partitions.items():
        for part in sources.slices(0, sources.committed):
            for records in read_slice_records(part):
                held.update((p, bytes(r.data)) for r in records)
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


def await_none_under_replicated(config: str) -> None:
    """Until `waltz cluster under-replicated` reports none (exit 0): a move ends once its target
    is recorded, and a replica that stays may be recorded in the same session a moment later
    (`recovering` until then), as an operator would see it."""
    deadline = time.monotonic() + UNDER_REPLICATED_WAIT_S
    while True:
        report = run_waltz_cli("cluster", "under-replicated", "--json", "-c", config)
        if report.returncode == 0:
            assert json.loads(report.stdout)["under_replicated_count"] == 0, report.stdout
            return
        assert time.monotonic() < deadline, report.stdout + report.stderr
        time.sleep(UNDER_REPLICATED_POLL_S)


def assert_replicas_caught_up_and_equal(cluster: LocalCluster) -> None:
    """`waltz cluster under-replicated` reports none and `waltz storage checksum --online` finds
    every replica equal (exit 0)."""
    config = str(cluster.client_config_path)
    await_none_under_replicated(config)
    run_cli_each([(["storage", "checksum", "--online", "--json", "-c", config], "")])


def kill_at(arguments: list[str], line: str) -> list[str]:
    """Start `waltz ARGS`, kill it (SIGKILL) as soon as it prints ``line`` on stderr; what it
    printed up to there."""
    process = subprocess.Popen(
        waltz_cli_command(*arguments), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = []
    try:
        assert process.stderr is not None
        for printed in process.stderr:
            seen.append(printed)
            if line in printed:
                process.send_signal(signal.SIGKILL)
                break
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(CLI_TIMEOUT_S)
    assert any(line in s for s in seen), "".join(seen)
    return seen


# How often a wait looks again.
WAIT_POLL_S = 0.2


def wait_for(what: str, check: Callable[[], bool], timeout_ms: int) -> None:
    """Until ``check()`` (bounded: fails naming ``what``)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_ms} ms: {what}"
        time.sleep(WAIT_POLL_S)


def short_session_config(cluster: LocalCluster, directory: Path, session_timeout_ms: int) -> str:
    """The cluster's client config with a short ZooKeeper session: the replica mover lease of a
    killed decommission goes with it."""
    config = yaml.safe_load(cluster.client_config_path.read_text(encoding="utf-8"))
    config["zookeeper.sessionTimeout"] = session_timeout_ms
    path = directory / "tools.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)
