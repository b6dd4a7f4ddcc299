"""The original's RecoveryManagerTest scenarios, on real storage nodes and a real ZooKeeper.

Each scenario gets its own partition on one shared set of five storage nodes. Replica ``i``
lives on node ``i`` behind its own ``TcpProxy`` (its connect string in ZK is the proxy's), so a
replica is "unavailable" by refusing connections. Storage states are written with a
StorageClient session, ZK states with the store metadata helpers; then a ``Store`` opens a
session for the partition (ZK session 998 → new session 999) and we check what the original
checks: every recovered replica has low-water mark == max txid within [120, 125] (or -1), and
the ZK replica states of recovered replicas carry the new session id, unresolved. Then every
replica comes back and the same must hold for all of them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
from store_cluster_support import (
    StorageCluster,
    bounded,
    metadata,
    open_store,
    recovered,
    register,
    replica_state,
    set_up_storage,
    storage_state,
    wait_until,
    wait_until_async,
    write_metadata,
)

from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK as U

NUM_NODES = 5
NUM_PARTITIONS = 32
GENERATION = 10
PREVIOUS_SESSION_ID = 998
SESSION_ID = PREVIOUS_SESSION_ID + 1
MIN_EXPECTED_HWM = 120
MAX_EXPECTED_HWM = 125
REMOVED = None  # availability of a replica taken out of the assignment

_partition_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageCluster]:
    storage_cluster = StorageCluster(
        zookeeper, tmp_path_factory.mktemp("recovery"), NUM_NODES, NUM_PARTITIONS
    )
    storage_cluster.start()
    try:
        yield storage_cluster
    finally:
        storage_cluster.close()


class Scenario(NamedTuple):
    meta_session_ids: Sequence[int]
    meta_hwms: Sequence[int]
    storage_session_ids: Sequence[int]
    storage_lwms: Sequence[int]
    storage_max_txids: Sequence[int]
    available: Sequence[bool | None] = (True,) * 5
    min_hwm: int = MIN_EXPECTED_HWM
    max_hwm: int = MAX_EXPECTED_HWM


def run(cluster: StorageCluster, zookeeper: str, scenario: Scenario) -> None:
    partition_id = next(_partition_ids)
    assert partition_id < NUM_PARTITIONS
    with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:
        asyncio.run(_run(cluster, zk, partition_id, scenario))


# Every connect string used in the module's cluster: the kernel may hand a closed proxy's port
# to a new proxy, but the old name stays registered in ZooKeeper ("Storage node already exists").
_USED_NAMES: set[str] = set()
MAX_PROXY_ATTEMPTS = 20


async def _fresh_proxy(host: str, port: int) -> TcpProxy:
    """A started proxy whose connect string no earlier scenario used."""
    rejected: list[TcpProxy] = []
    try:
        for _ in range(MAX_PROXY_ATTEMPTS):
            proxy = await TcpProxy(host, port).start()
            if proxy.connect_string not in _USED_NAMES:
                _USED_NAMES.add(proxy.connect_string)
                return proxy
            rejected.append(proxy)  # kept open so the kernel offers another port
        raise AssertionError(f"no unused proxy port in {MAX_PROXY_ATTEMPTS} attempts")
    finally:
        for proxy in rejected:
            await proxy.close()


async def _run(cluster: StorageCluster, zk: object, partition_id: int, s: Scenario) -> None:
    n = len(s.storage_session_ids)
    available = list(s.available[:n])
    proxies: dict[int, TcpProxy] = {}
    connect_strings: dict[int, str] = {}
    for i in range(n):
        node = cluster.nodes[i]
        if available[i] is REMOVED:
            connect_strings[i] = f"127.0.0.1:{60000 + i}"  # only in the old ZK metadata
            _USED_NAMES.add(connect_strings[i])
            continue
        proxy = await _fresh_proxy(node.host, node.port)
        proxy.refuse = not available[i]
        proxies[i] = proxy
        connect_strings[i] = proxy.connect_string
        await asyncio.to_thread(
            register, zk, cluster.root, proxy.connect_string, node.admin_port, [partition_id]
        )
        await set_up_storage(
            node, partition_id, s.storage_session_ids[i], s.storage_lwms[i], s.storage_max_txids[i]
        )
    states = [
        replica_state(partition_id, connect_strings[i], s.meta_session_ids[i], s.meta_hwms[i])
        for i in range(len(s.meta_session_ids))
    ]
    await asyncio.to_thread(
        write_metadata, zk, cluster.root, partition_id, GENERATION, PREVIOUS_SESSION_ID, states
    )

    store = await open_store(zk, cluster.root)  # type: ignore[arg-type]
    try:
        partition = store.partition(partition_id)
        await partition.set_generation(GENERATION)
        await bounded(partition.ensure_open())
        up = [i for i in proxies if available[i]]
        await check(cluster, zk, partition, partition_id, s, up, [connect_strings[i] for i in up])

        for proxy in proxies.values():
            proxy.refuse = False
        every = list(proxies)
        await check(cluster, zk, partition, partition_id, s, every, [connect_strings[i] for i in every])
        assert {st.replica_id.storage for st in metadata(zk, cluster.root, partition_id).replica_states} == {  # type: ignore[arg-type]
            connect_strings[i] for i in every
        }
    finally:
        await store.close()
        for proxy in proxies.values():
            await proxy.close()


async def check(
    cluster: StorageCluster,
    zk: object,
    partition: object,
    partition_id: int,
    s: Scenario,
    replicas: list[int],
    storages: list[str],
) -> None:
    from waltz_engine.server.store import StorePartition

    assert isinstance(partition, StorePartition)
    await wait_until(lambda: recovered(partition.status(), storages), f"replicas {replicas} recovered")
    for i in replicas:
        info, max_txid = await storage_state(cluster.nodes[i], partition_id)
        assert info.session_id == SESSION_ID, f"replica {i}"
        assert info.low_water_mark == max_txid, f"replica {i}: lwm {info.low_water_mark} max {max_txid}"
        assert s.min_hwm <= max_txid <= s.max_hwm, f"replica {i}: max txid {max_txid}"
    assert s.min_hwm <= partition.high_water_mark <= s.max_hwm

    def in_session() -> list[object]:
        md = metadata(zk, cluster.root, partition_id)  # type: ignore[arg-type]
        return [st for st in md.replica_states if st.session_id == SESSION_ID]

    async def metadata_done() -> bool:
        return len(await asyncio.to_thread(in_session)) == len(replicas)

    await wait_until_async(metadata_done, "replica states of the recovered replicas in ZK")
    md = metadata(zk, cluster.root, partition_id)  # type: ignore[arg-type]
    assert (md.generation, md.session_id) == (GENERATION, SESSION_ID)
    for st in md.replica_states:
        if st.session_id == SESSION_ID:
            assert st.closing_high_water_mark == U
            assert st.replica_id.storage in storages


F, T = False, True


def test_basic1_all_replicas_new(cluster: StorageCluster, zookeeper: str) -> None:
    run(cluster, zookeeper, Scenario([], [], [-1] * 5, [-1] * 5, [-1] * 5, min_hwm=-1, max_hwm=-1))


def test_basic2_all_replicas_vote(cluster: StorageCluster, zookeeper: str) -> None:
    run(cluster, zookeeper, Scenario([998] * 5, [U] * 5, [998] * 5, [110] * 5, [125, 125, 120, 115, 115]))


def test_basic3_three_replicas_vote(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997], [U, U, U, 100, 100], [998] * 5, [110] * 5, [125, 125, 120, 115, 115]
        ),
    )


def test_basic4_two_replicas_vote(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, 110, 110, 110],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 120, 105, 105],
        ),
    )


def test_basic5_one_replica_votes(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, 110, 110, 100, 100],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 120, 105, 105],
        ),
    )


def test_basic6_dirty_records_truncated(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, 110, 110, 100, 100],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 130, 105, 105],
        ),
    )


def test_recovery_after_recovery_failure1(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997, 997, 997],
            [U, U, 120, 120, 120],
            [998, 998, 997, 997, 997],
            [120, 120, 100, 100, 100],
            [120, 120, 105, 105, 105],
        ),
    )


def test_recovery_after_recovery_failure2(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997, 996, 996],
            [U, U, 120, 100, 100],
            [998, 998, 997, 996, 996],
            [120, 120, 100, 100, 100],
            [120, 120, 105, 105, 105],
        ),
    )


def test_catch_up_replicas(cluster: StorageCluster, zookeeper: str) -> None:
    # The two up-to-date replicas are away: the three left must agree, two of them catching up.
    run(
        cluster,
        zookeeper,
        Scenario([998] * 5, [U] * 5, [998] * 5, [120] * 5, [120, 120, 120, 110, 100], [F, F, T, T, T]),
    )


def test_inconsistent_storage1(cluster: StorageCluster, zookeeper: str) -> None:
    # Replica 2 was restored from an old copy (storage session 997 < ZK 998): truncated to its
    # low-water mark, refilled, never voting.
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, U, 100, 100],
            [998, 998, 997, 997, 997],
            [110, 110, 100, 100, 100],
            [125, 120, 115, 115, 115],
        ),
    )


def test_inconsistent_storage2(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, U, 100, 100],
            [998, 998, 997, 997, 997],
            [110, 110, 100, 100, 100],
            [125, 120, 130, 115, 115],
        ),
    )


def test_replica_unavailable1(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, U, 100, 100],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 120, 115, 115],
            [T, T, F, T, T],
        ),
    )


def test_replica_unavailable2(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, U, 100, 100],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 120, 115, 115],
            [T, T, F, F, T],
        ),
    )


def test_replica_unavailable3(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario([998] * 5, [U] * 5, [998] * 5, [110] * 5, [120, 120, 115, 115, 110], [F, T, T, T, F]),
    )


def test_replica_unavailable4(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario([998] * 5, [U] * 5, [998] * 5, [110] * 5, [120, 120, 120, 115, 115], [F, F, T, T, T]),
    )


def test_replica_added1(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997],
            [U, U, 100],
            [998, 998, 997, 997],
            [110, 110, 100, 100],
            [120, 120, 115, 115],
            [T] * 4,
        ),
    )


def test_replica_added2(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997],
            [U, U, 100],
            [998, 998, 997, 997, 997],
            [110, 110, 100, 100, 100],
            [120, 120, 115, 115, 115],
        ),
    )


def test_replica_added3(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997],
            [U, U, 100],
            [998, 998, 997, 997],
            [110, 110, 100, 100],
            [120, 120, 115, 115],
            [F, T, T, T],
        ),
    )


def test_replica_removed1(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997], [U, U, 100], [998, 998, 997], [110, 110, 100], [120, 120, 115], [REMOVED, T, T]
        ),
    )


def test_replica_removed2(cluster: StorageCluster, zookeeper: str) -> None:
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 998, 997, 997],
            [U, U, U, 100, 100],
            [998, 998, 998, 997, 997],
            [110, 110, 110, 100, 100],
            [120, 120, 120, 115, 115],
            [REMOVED, REMOVED, T, T, T],
        ),
    )


def test_replica_replaced(cluster: StorageCluster, zookeeper: str) -> None:
    # Replica 0 leaves, replica 3 joins; replica 2 decides only after catching up with replica 1.
    run(
        cluster,
        zookeeper,
        Scenario(
            [998, 998, 997],
            [U, U, U],
            [998, 998, 997, 997],
            [110, 110, 100, 100],
            [120, 120, 115, 115],
            [REMOVED, T, T, T],
        ),
    )


def test_idempotency(cluster: StorageCluster, zookeeper: str, tmp_path: Path) -> None:
    """A recovery whose ZK update was lost is redone by the next session with the same outcome."""
    partition_id = next(_partition_ids)
    s = Scenario([998] * 5, [U] * 5, [998] * 5, [110] * 5, [120, 120, 120, 115, 115])
    with connect(ZooKeeperSettings(zookeeper, cluster.root)) as zk:

        async def go() -> None:
            storages = []
            for i, node in enumerate(cluster.nodes):
                storage = f"{node.host}:{node.port}"
                storages.append(storage)
                await set_up_storage(
                    node, partition_id, s.storage_session_ids[i], s.storage_lwms[i], s.storage_max_txids[i]
                )
            await asyncio.to_thread(_register_partition, zk, cluster, partition_id)
            states = [replica_state(partition_id, storages[i], 998, U) for i in range(5)]
            await asyncio.to_thread(
                write_metadata, zk, cluster.root, partition_id, GENERATION, PREVIOUS_SESSION_ID, states
            )
            for expected_session_id in (SESSION_ID, SESSION_ID + 1):
                store = await open_store(zk, cluster.root)
                try:
                    partition = store.partition(partition_id)
                    await partition.set_generation(GENERATION)
                    await bounded(partition.ensure_open())
                    await wait_until(lambda p=partition: recovered(p.status(), storages), "all recovered")
                    assert MIN_EXPECTED_HWM <= partition.high_water_mark <= MAX_EXPECTED_HWM
                    first_hwm = partition.high_water_mark
                finally:
                    await store.close()
                for node in cluster.nodes:
                    info, max_txid = await storage_state(node, partition_id)
                    assert info.session_id == expected_session_id
                    assert info.low_water_mark == max_txid == first_hwm
                # Lose the replica-state update, as if the server died right before it.
                await asyncio.to_thread(
                    write_metadata, zk, cluster.root, partition_id, GENERATION, expected_session_id, states
                )

        asyncio.run(go())


def _register_partition(zk: object, cluster: StorageCluster, partition_id: int) -> None:
    from waltz_engine.zk.store_metadata import read_replica_assignments

    existing = read_replica_assignments(zk, cluster.root).as_dict()  # type: ignore[arg-type]
    for node in cluster.nodes:
        storage = f"{node.host}:{node.port}"
        if storage in existing:
            from waltz_engine.zk.store_metadata import assign_partitions

            assign_partitions(zk, cluster.root, storage, [partition_id])  # type: ignore[arg-type]
        else:
            register(zk, cluster.root, storage, node.admin_port, [partition_id])  # type: ignore[arg-type]
