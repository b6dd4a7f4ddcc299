"""Real storage nodes + ZooKeeper store metadata for the store-layer tests.

``StorageCluster`` starts ``n`` `waltz storage start` processes on one cluster root with every
partition assigned on every node; ``register`` puts a connect string (a node's own, or a
``TcpProxy`` in front of it) into ``store/assignment`` as `waltz zk add-storage-node` and
`assign-partition` do.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from storage_node_support import StorageNodeProcess, client_ssl, create_test_cluster, make_records

from waltz_engine.common.record import Record
from waltz_engine.server.store import Store, StoreConfig
from waltz_engine.server.store.store_partition import StorePartition
from waltz_engine.storage.admin_ops import replica_checksums
from waltz_engine.storage.client import SessionInfo
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK, PartitionMetadata, ReplicaId, ReplicaState
from waltz_engine.zk.retention import set_retention_bound
from waltz_engine.zk.store_metadata import (
    add_storage_node,
    assign_partitions,
    read_partition_metadata,
    write_partition_metadata,
)

T = TypeVar("T")

# Fast retries so that a replica coming back is noticed quickly; same shape as the defaults.
TEST_STORE_CONFIG = StoreConfig(initial_retry_interval_ms=20, max_retry_interval_ms=200)
WAIT_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
GROUP_ID = 0


class StorageCluster:
    def __init__(self, zookeeper: str, work_dir: Path, num_nodes: int, num_partitions: int) -> None:
        self.zookeeper = zookeeper
        self.num_partitions = num_partitions
        self.root, self.key = create_test_cluster(zookeeper, num_partitions)
        self.nodes = [
            StorageNodeProcess(
                zookeeper, self.root, self.key, num_partitions, work_dir / f"node{i}", jetty=False
            )
            for i in range(num_nodes)
        ]

    def start(self) -> StorageCluster:
        try:
            for node in self.nodes:
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready()
                node.assign()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def checksums(self, partition_id: int) -> list[int]:
        """The replicas' partition checksums (nodes must be stopped)."""
        sums = [
            replica_checksums(node.directory, self.key, self.num_partitions, [partition_id])
            for node in self.nodes
        ]
        return [s.checksums[partition_id] for s in sums]


@contextmanager
def started_cluster(
    zookeeper: str,
    work_dir: Path,
    num_nodes: int,
    num_partitions: int,
    retention_bounds: Mapping[int, int] | None = None,
) -> Iterator[StorageCluster]:
    """A started :class:`StorageCluster`, closed after; ``retention_bounds`` (partition -> bound)
    are set before the nodes start, so their cleaner's first round tells the partitions."""
    storage_cluster = StorageCluster(zookeeper, work_dir, num_nodes, num_partitions)
    if retention_bounds:
        with connect(ZooKeeperSettings(zookeeper, storage_cluster.root)) as zk:
            for partition_id, bound in retention_bounds.items():
                set_retention_bound(zk, storage_cluster.root, partition_id, bound)
    storage_cluster.start()
    try:
        yield storage_cluster
    finally:
        storage_cluster.close()


def node_connect_string(node: StorageNodeProcess) -> str:
    return f"{node.host}:{node.port}"


def register(zk: KazooClient, root: str, storage: str, admin_port: int, partitions: Sequence[int]) -> None:
    add_storage_node(zk, root, storage, GROUP_ID, admin_port)
    if partitions:
        assign_partitions(zk, root, storage, partitions)


def write_metadata(
    zk: KazooClient,
    root: str,
    partition_id: int,
    generation: int,
    session_id: int,
    states: Sequence[ReplicaState],
) -> None:
    _, version = read_partition_metadata(zk, root, partition_id)
    write_partition_metadata(
        zk, root, partition_id, PartitionMetadata(generation, session_id, tuple(states)), version
    )


def metadata(zk: KazooClient, root: str, partition_id: int) -> PartitionMetadata:
    return read_partition_metadata(zk, root, partition_id).metadata


def write_clean_metadata(
    zk: KazooClient, root: str, partition_id: int, generation: int, session_id: int, storages: Sequence[str]
) -> None:
    """``store/partition/<p>`` as a recovery of ``session_id`` leaves it: every one of ``storages``
    recorded clean (unresolved) in that session."""
    states = [replica_state(partition_id, s, session_id, UNRESOLVED_HIGH_WATER_MARK) for s in storages]
    write_metadata(zk, root, partition_id, generation, session_id, states)


def replica_state(partition_id: int, storage: str, session_id: int, closing_hwm: int) -> ReplicaState:
    return ReplicaState(ReplicaId(partition_id, storage), session_id, closing_hwm)


async def set_up_storage(
    node: StorageNodeProcess, partition_id: int, session_id: int, low_water_mark: int, max_transaction_id: int
) -> None:
    """Make the replica hold records 0..max with (session id, low-water mark) in its control file."""
    if session_id < 0:
        return
    records = make_records(0, max_transaction_id + 1, partition_id)
    client = node.data_client()
    await client.open()
    try:
        below = [r for r in records if r.transaction_id <= low_water_mark]
        above = [r for r in records if r.transaction_id > low_water_mark]
        if below:
            await client.append(session_id, partition_id, below)
        await client.set_low_water_mark(session_id, partition_id, low_water_mark)
        if above:
            await client.append(session_id, partition_id, above)
    finally:
        await client.close()


async def begin_late(
    node: StorageNodeProcess, partition_id: int, session_id: int, first: int, last: int
) -> None:
    """The replica holds ``first``..``last`` only, as after retention removed its head, with
    ``last`` as its low-water mark (its node must know a retention bound above ``first``)."""
    client = node.data_client()
    await client.open()
    try:
        await client.append(session_id, partition_id, make_records(first, last - first + 1, partition_id))
        await client.set_low_water_mark(session_id, partition_id, last)
    finally:
        await client.close()


async def storage_state(node: StorageNodeProcess, partition_id: int) -> tuple[SessionInfo, int]:
    """(last session info, max txid) read straight from the node."""
    info = await node.with_admin(lambda admin: admin.last_session_info(partition_id))
    client = node.data_client()
    await client.open()
    try:
        return info, await client.max_transaction_id(info.session_id, partition_id)
    finally:
        await client.close()


async def holds_exactly(node: StorageNodeProcess, partition_id: int, max_transaction_id: int) -> bool:
    """The replica's log ends at ``max_transaction_id`` (read on its admin port, no session)."""

    async def tail(transaction_id: int) -> int:
        return len(await node.with_admin(lambda admin: admin.record_list(partition_id, transaction_id, 1)))

    return await tail(max_transaction_id) == 1 and await tail(max_transaction_id + 1) == 0


async def read_all(node: StorageNodeProcess, partition_id: int, session_id: int, count: int) -> list[Record]:
    client = node.data_client()
    await client.open()
    try:
        out: list[Record] = []
        while len(out) < count:
            batch = await client.records(session_id, partition_id, len(out), 500)
            if not batch:
                break
            out.extend(batch)
        return out
    finally:
        await client.close()


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def wait_until_async(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def bounded(awaitable: Awaitable[T], timeout_s: float = WAIT_TIMEOUT_S) -> T:
    return await asyncio.wait_for(awaitable, timeout_s)


def replica_statuses(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    session = status.get("session")
    if not session:
        return {}
    return {replica["storage"]: replica for replica in session["replicas"]}


def recovered(status: dict[str, Any], storages: Sequence[str]) -> bool:
    """Every one of ``storages`` finished recovery in the current session."""
    replicas = replica_statuses(status)
    return all(
        s in replicas
        and replicas[s]["state"] in ("voting", "catching-up")
        and replicas[s]["max_transaction_id"] is not None
        for s in storages
    )


def caught_up(status: dict[str, Any], storages: Sequence[str]) -> bool:
    replicas = replica_statuses(status)
    return recovered(status, storages) and all(replicas[s]["lag"] == 0 for s in storages)


async def open_store(zk: KazooClient, root: str, config: StoreConfig = TEST_STORE_CONFIG) -> Store:
    store = Store(zk, root, client_ssl(), config)
    await store.start()
    return store


async def begin_open(
    store: Store, partition_id: int, generation: int
) -> tuple[StorePartition, asyncio.Task[None]]:
    """The store partition of ``partition_id`` at ``generation`` and the task opening its store
    session (its recovery), for a test that acts while the recovery runs."""
    partition = store.partition(partition_id)
    await partition.set_generation(generation)
    return partition, asyncio.create_task(partition.ensure_open())


async def recover_all(
    zk: KazooClient, root: str, partition_id: int, generation: int, storages: Sequence[str]
) -> int:
    """Open a store session of ``partition_id`` and wait until every one of ``storages`` caught
    up; the partition's high-water mark then (the store is closed again)."""
    store = await open_store(zk, root)
    try:
        partition = store.partition(partition_id)
        await partition.set_generation(generation)
        await bounded(partition.ensure_open())
        await wait_until(lambda: caught_up(partition.status(), storages), "every replica caught up")
        return partition.high_water_mark
    finally:
        await store.close()


@contextmanager
def stoppable_cluster(
    zookeeper: str, work_dir: Path, num_nodes: int, num_partitions: int
) -> Iterator[StorageCluster]:
    """A started :class:`StorageCluster` whose nodes a test may stop (SIGSTOP): each running one
    is continued before the cluster closes."""
    storage_cluster = StorageCluster(zookeeper, work_dir, num_nodes, num_partitions)
    storage_cluster.start()
    try:
        yield storage_cluster
    finally:
        for node in storage_cluster.nodes:
            if node.running:
                os.kill(node.pid, signal.SIGCONT)
        storage_cluster.close()


@contextmanager
def registered_nodes(storage_cluster: StorageCluster, zookeeper: str) -> Iterator[KazooClient]:
    """A ZooKeeper client of the cluster, every node registered (its own connect string) with
    every partition assigned."""
    with connect(ZooKeeperSettings(zookeeper, storage_cluster.root)) as zk:
        for node in storage_cluster.nodes:
            partitions = list(range(storage_cluster.num_partitions))
            register(zk, storage_cluster.root, node_connect_string(node), node.admin_port, partitions)
        yield zk
