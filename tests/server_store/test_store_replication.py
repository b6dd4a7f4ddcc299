"""Replicated appends through a Store on three real storage nodes: quorum, failures, fencing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from store_cluster_support import (
    StorageCluster,
    bounded,
    caught_up,
    node_connect_string,
    open_store,
    read_all,
    recovered,
    register,
    stoppable_cluster,
    wait_until,
)

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.server.store import GenerationMismatchError, Store, StoreConfig, StorePartition
from waltz_engine.server.store.queued_appends import FAILED_TRANSACTION_ID
from waltz_engine.zk.connection import ZooKeeperSettings, connect

NUM_NODES = 3
NUM_PARTITIONS = 2
PARTITION_ID = 0
GENERATION = 1
CLIENT_ID = 7
# How long an append must stay unresolved while only one storage answers (no timed success claim).
NOT_RESOLVED_PROBE_S = 1.0


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with stoppable_cluster(zookeeper, tmp_path, NUM_NODES, NUM_PARTITIONS) as storage_cluster:
        yield storage_cluster


@pytest.fixture
def zk(cluster: StorageCluster, zookeeper: str) -> Iterator[KazooClient]:
    with connect(ZooKeeperSettings(zookeeper, cluster.root)) as client:
        yield client


def register_nodes(zk: KazooClient, cluster: StorageCluster, storages: list[str] | None = None) -> list[str]:
    names = storages or [node_connect_string(node) for node in cluster.nodes]
    for name, node in zip(names, cluster.nodes, strict=True):
        register(zk, cluster.root, name, node.admin_port, list(range(NUM_PARTITIONS)))
    return names


class Appender:
    """Appends with distinct ReqIds and remembers every outcome."""

    def __init__(self, partition: StorePartition, generation: int = GENERATION) -> None:
        self.partition = partition
        self.generation = generation
        self.seq = 0
        self.futures: dict[ReqId, asyncio.Future[int]] = {}

    async def append(self) -> asyncio.Future[int]:
        self.seq += 1
        req_id = ReqId(CLIENT_ID, self.generation, PARTITION_ID, self.seq)
        data = f"data-{self.seq}".encode()
        future = await self.partition.append(req_id, self.seq % 5, data, to_signed32(zlib.crc32(data)))
        self.futures[req_id] = future
        return future

    def committed(self) -> dict[int, ReqId]:
        out: dict[int, ReqId] = {}
        for req_id, future in self.futures.items():
            if future.done() and not future.exception() and future.result() != FAILED_TRANSACTION_ID:
                assert future.result() not in out, "two appends got the same txid"
                out[future.result()] = req_id
        return out


async def check_log(cluster: StorageCluster, appender: Appender, hwm: int, session_id: int) -> None:
    """Every acknowledged append is in the log at its txid, nothing else is, and txids are 0..hwm."""
    committed = appender.committed()
    assert sorted(committed) == list(range(hwm + 1)), "committed txids must be exactly 0..hwm"
    records = await read_all(cluster.nodes[0], PARTITION_ID, session_id, hwm + 2)
    assert [r.transaction_id for r in records] == list(range(hwm + 1))
    for record in records:
        assert record.req_id == committed[record.transaction_id]
        assert record.data == f"data-{record.req_id.seq_num}".encode()


async def stop_store_and_compare(cluster: StorageCluster, store: Store, storages: list[str]) -> None:
    partition = store.partition(PARTITION_ID)
    await wait_until(lambda: caught_up(partition.status(), storages), "every replica caught up")
    await store.close()
    for node in cluster.nodes:
        node.close()
    checksums = cluster.checksums(PARTITION_ID)
    assert len(set(checksums)) == 1, f"replicas differ: {checksums}"


def current_session_id(partition: StorePartition) -> int:
    session = partition.status()["session"]
    assert isinstance(session, dict)
    return int(session["session_id"])


@asynccontextmanager
async def appending(
    zk: KazooClient, cluster: StorageCluster, config: StoreConfig | None = None
) -> AsyncIterator[tuple[StorePartition, Appender]]:
    """A store on the cluster, its partition at GENERATION and an appender; the store closed after."""
    store = await open_store(zk, cluster.root, *([config] if config is not None else []))
    try:
        partition = store.partition(PARTITION_ID)
        await partition.set_generation(GENERATION)
        yield partition, Appender(partition)
    finally:
        await store.close()


def test_write_commits_only_when_a_quorum_has_it(cluster: StorageCluster, zk: KazooClient) -> None:
    storages = register_nodes(zk, cluster)

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition = store.partition(PARTITION_ID)
            await partition.set_generation(GENERATION)
            appender = Appender(partition)
            assert await bounded(await appender.append()) == 0
            await wait_until(lambda: caught_up(partition.status(), storages), "replicas in sync")
            one, two = cluster.nodes[1], cluster.nodes[2]
            os.kill(one.pid, signal.SIGSTOP)
            os.kill(two.pid, signal.SIGSTOP)
            future = await appender.append()
            done, _ = await asyncio.wait([future], timeout=NOT_RESOLVED_PROBE_S)
            assert not done, "one storage of three must not commit a write"
            os.kill(one.pid, signal.SIGCONT)
            assert await bounded(future) == 1
            os.kill(two.pid, signal.SIGCONT)
            assert await bounded(partition.flush()) == 1
            await check_log(cluster, appender, 1, current_session_id(partition))
            await stop_store_and_compare(cluster, store, storages)
        finally:
            await store.close()

    asyncio.run(go())


def test_storage_failures_stop_and_resume_appends_without_loss(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    storages = register_nodes(zk, cluster)
    first, second = cluster.nodes[2], cluster.nodes[1]

    async def append_some(appender: Appender, count: int) -> list[int]:
        futures = [await appender.append() for _ in range(count)]
        return [await bounded(f) for f in futures]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition = store.partition(PARTITION_ID)
            await partition.set_generation(GENERATION)
            appender = Appender(partition)
            assert await append_some(appender, 50) == list(range(50))

            first.kill()
            # The session that saw the failure rolls; later appends commit on the two left.
            await append_some(appender, 30)
            results = await append_some(appender, 30)
            assert all(txid >= 0 for txid in results)
            # Two of three commit without the dead one, so its loss may be noticed only now: the
            # session then rolls onto the two left, and the partition is healthy again.
            await wait_until(lambda: partition.healthy, "the partition healthy on two replicas")

            second.kill()
            stuck = [await appender.append() for _ in range(5)]
            await wait_until(lambda: not partition.healthy, "the partition reported unhealthy")
            assert not any(f.done() and f.result() >= 0 for f in stuck[1:])

            await asyncio.to_thread(first.start)
            resolved = [await bounded(f) for f in stuck]
            assert resolved[-1] >= 0 or resolved[-1] == FAILED_TRANSACTION_ID
            assert all(txid >= 0 for txid in await append_some(appender, 30))
            assert partition.healthy

            await asyncio.to_thread(second.start)
            hwm = await bounded(partition.flush())
            await check_log(cluster, appender, hwm, current_session_id(partition))
            await stop_store_and_compare(cluster, store, storages)
        finally:
            await store.close()

    asyncio.run(go())


def test_generation_fencing(cluster: StorageCluster, zk: KazooClient) -> None:
    register_nodes(zk, cluster)

    async def go() -> None:
        old_store = await open_store(zk, cluster.root)
        new_store = await open_store(zk, cluster.root)
        try:
            old = old_store.partition(PARTITION_ID)
            await old.set_generation(GENERATION)
            old_appender = Appender(old)
            assert await bounded(await old_appender.append()) == 0

            new = new_store.partition(PARTITION_ID)
            await new.set_generation(GENERATION + 1)
            new_appender = Appender(new, GENERATION + 1)
            assert await bounded(await new_appender.append()) == 1

            # The old owner's open session is fenced by the storage nodes (older session id) ...
            # (on a loaded machine its session may have met the fence already, and then it
            # refuses this append at once: either way nothing of it commits)
            fenced = None
            with contextlib.suppress(GenerationMismatchError):
                fenced = await old_appender.append()
            # ... and it cannot open a new one: ZooKeeper holds a newer generation.
            with pytest.raises(GenerationMismatchError):
                for _ in range(100):
                    await bounded(old_appender.append())
                    await asyncio.sleep(0.05)
            assert fenced is None or not partition_has_committed(fenced)
            # A request of another generation is refused at once.
            with pytest.raises(GenerationMismatchError):
                await Appender(new, GENERATION).append()

            fresh_store = await open_store(zk, cluster.root)
            try:
                stale = fresh_store.partition(PARTITION_ID)
                await stale.set_generation(GENERATION)
                with pytest.raises(GenerationMismatchError):
                    await bounded(stale.ensure_open())
            finally:
                await fresh_store.close()
            assert await bounded(new.flush()) == 1
        finally:
            await old_store.close()
            await new_store.close()

    asyncio.run(go())


def partition_has_committed(future: asyncio.Future[int]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None and future.result() >= 0


def test_random_connection_cuts_lose_and_duplicate_nothing(cluster: StorageCluster, zk: KazooClient) -> None:
    num_appends = 1500
    cut_every = 100
    rng = random.Random(20240601)

    async def go() -> None:
        proxies = [await TcpProxy(node.host, node.port).start() for node in cluster.nodes]
        storages = await asyncio.to_thread(register_nodes, zk, cluster, [p.connect_string for p in proxies])
        store = await open_store(
            zk,
            cluster.root,
            StoreConfig(max_batch_size=20, initial_retry_interval_ms=10, max_retry_interval_ms=100),
        )
        try:
            partition = store.partition(PARTITION_ID)
            await partition.set_generation(GENERATION)
            appender = Appender(partition)
            cuts = 0
            for i in range(num_appends):
                await appender.append()
                if i % cut_every == cut_every - 1:
                    for _ in range(rng.randint(1, 3)):
                        cuts += rng.choice(proxies).disconnect_all()
                    await asyncio.sleep(0)
            hwm = await bounded(partition.flush())
            for future in appender.futures.values():
                assert future.done()
            assert cuts > 0
            assert hwm >= 0
            await check_log(cluster, appender, hwm, current_session_id(partition))
            await stop_store_and_compare(cluster, store, storages)
        finally:
            await store.close()
            for proxy in proxies:
                await proxy.close()

    asyncio.run(go())


def test_checkpoint_interval_forces_new_sessions(cluster: StorageCluster, zk: KazooClient) -> None:
    register_nodes(zk, cluster)

    async def go() -> None:
        async with appending(
            # No marks within a session: only the checkpoints' new sessions move the nodes' marks.
            zk,
            cluster,
            StoreConfig(checkpoint_interval=40, initial_retry_interval_ms=10, low_water_mark_interval_ms=0),
        ) as (partition, appender):
            committed: list[int] = []
            for _ in range(5):  # the checkpoint is checked against committed transactions
                futures = [await appender.append() for _ in range(20)]
                committed += [await bounded(f) for f in futures]
            assert committed == list(range(100))
            status = partition.status()["session"]
            assert isinstance(status, dict)
            # Sessions: [-1..39], [40..79], [80..] → the third session, low-water mark 79.
            assert status["low_water_mark"] == 79
            # A session opens with a quorum: node 0 may still be recovering into it (it sets the
            # low-water mark last), and under load it may have lagged through the earlier ones.
            node0 = [node_connect_string(cluster.nodes[0])]
            await wait_until(lambda: recovered(partition.status(), node0), "node 0 recovered")
            info = await cluster.nodes[0].with_admin(lambda a: a.last_session_info(PARTITION_ID))
            assert info.low_water_mark == 79 and info.session_id == status["session_id"]

    asyncio.run(go())


def test_zookeeper_lost_while_a_new_session_is_needed_delays_appends_and_fails_none(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """A new store session needs ZooKeeper (the session id is CAS'd into the partition's znode).
    With ZooKeeper gone, kazoo raises its own exceptions; they must be retried like any
    unavailable dependency, not end the caller (a smoke run's partition hung that way)."""
    register_nodes(zk, cluster)

    async def go() -> None:
        async with appending(
            zk, cluster, StoreConfig(checkpoint_interval=10, initial_retry_interval_ms=10)
        ) as (partition, appender):
            first = [await bounded(await appender.append()) for _ in range(10)]
            assert first == list(range(10))
            # The checkpoint is reached: the next append needs a new session, so ZooKeeper.
            await asyncio.to_thread(zk.stop)

            async def append_five() -> list[asyncio.Future[int]]:
                return [await appender.append() for _ in range(5)]

            five = asyncio.ensure_future(append_five())
            await asyncio.sleep(NOT_RESOLVED_PROBE_S)
            assert not five.done(), "an append waits for a session, which waits for ZooKeeper"
            await asyncio.to_thread(zk.start)
            waiting = await bounded(five)
            assert [await bounded(f) for f in waiting] == list(range(10, 15))
            assert await bounded(partition.flush()) == 14
            await check_log(cluster, appender, 14, current_session_id(partition))

    asyncio.run(go())


def test_an_idle_partition_whose_session_failed_opens_a_new_one_by_itself(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """Health must not wait for traffic: a smoke run ended with an idle partition reported
    unhealthy for minutes, its last session closed after an abstention and no append left to
    open the next one."""
    register_nodes(zk, cluster)

    async def go() -> None:
        async with appending(zk, cluster) as (partition, appender):
            assert [await bounded(await appender.append()) for _ in range(5)] == list(range(5))
            before = current_session_id(partition)
            cluster.nodes[2].kill()
            # Commits on the two left; the third abstains, so the session closes after it.
            assert await bounded(await appender.append()) == 5
            # No append, no flush from here: the partition opens its next session on its own.
            await wait_until(
                lambda: partition.healthy and current_session_id(partition) > before,
                "a new healthy session without traffic",
            )

    asyncio.run(go())


def test_a_replica_that_fails_after_the_recovery_resolved_is_recovered_without_traffic(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """A smoke run ended with `cluster verify` failing for minutes: one replica's recovery failed
    after a quorum had resolved the session's high-water mark (its node's ZooKeeper session had
    expired), and the idle session went on without it: nothing recovered it until an append."""
    storages = register_nodes(zk, cluster)
    lagging = cluster.nodes[2]

    async def go() -> None:
        async with appending(zk, cluster) as (partition, appender):
            assert [await bounded(await appender.append()) for _ in range(5)] == list(range(5))
            await wait_until(lambda: caught_up(partition.status(), storages), "every replica caught up")
            # The node stops answering on the connection the server keeps; a new session then
            # resolves on the other two, its third replica still waiting on its recovery.
            os.kill(lagging.pid, signal.SIGSTOP)
            await partition.set_generation(GENERATION + 1)
            await bounded(partition.ensure_open())
            resolved = current_session_id(partition)
            lagging.kill()  # the waiting recovery request fails: after the resolution
            await asyncio.to_thread(lagging.start)
            await wait_until(
                lambda: current_session_id(partition) > resolved and caught_up(partition.status(), storages),
                "the failed replica recovered in a new session, without an append",
            )

    asyncio.run(go())


def _register_partition_1_on_two(cluster: StorageCluster, zk: KazooClient) -> list[str]:
    """Nodes 0 and 1 hold partitions 0 and 1, node 2 only partition 0; their connect strings."""
    names = [node_connect_string(node) for node in cluster.nodes]
    for name, node, held in zip(names, cluster.nodes, ([0, 1], [0, 1], [0]), strict=True):
        register(zk, cluster.root, name, node.admin_port, held)
    return names


def test_an_assignment_change_reopens_only_the_sessions_of_partitions_whose_replicas_changed(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    from waltz_engine.zk.store_metadata import change_replicas

    names = _register_partition_1_on_two(cluster, zk)

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partitions = [store.partition(p) for p in range(NUM_PARTITIONS)]
            for partition in partitions:
                await partition.set_generation(GENERATION)
                await bounded(partition.ensure_open())
            unchanged, changed = (current_session_id(p) for p in partitions)
            await asyncio.to_thread(change_replicas, zk, cluster.root, [(names[2], 1)])
            await wait_until(
                lambda: (
                    partitions[1].status()["session"] is not None
                    and current_session_id(partitions[1]) > changed
                ),
                "partition 1 reopened with its new replica",
            )
            assert current_session_id(partitions[0]) == unchanged
        finally:
            await store.close()

    asyncio.run(go())


def test_a_replica_added_while_a_session_opens_joins_the_next_session(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    # The change arrives while the session is still opening (one of its replicas is stopped), so
    # there is no open session to close: the session that opens with the old replicas is
    # followed by one with the new replica (issue 32: the simulator's seed 16 at --faults 20 left
    # a moved-to node out of every session and the move waited on it forever).
    from waltz_engine.zk.store_metadata import change_replicas

    names = _register_partition_1_on_two(cluster, zk)
    stopped = cluster.nodes[1]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition = store.partition(1)
            await partition.set_generation(GENERATION)
            os.kill(stopped.pid, signal.SIGSTOP)
            opening = asyncio.create_task(partition.ensure_open())
            await asyncio.sleep(NOT_RESOLVED_PROBE_S)
            assert not opening.done()  # no quorum of 2 without the stopped node
            await asyncio.to_thread(change_replicas, zk, cluster.root, [(names[2], 1)])
            await asyncio.sleep(NOT_RESOLVED_PROBE_S)  # the watch has fired meanwhile
            os.kill(stopped.pid, signal.SIGCONT)
            await bounded(opening)
            await wait_until(lambda: recovered(partition.status(), names), "the added replica in a session")
        finally:
            await store.close()

    asyncio.run(go())
