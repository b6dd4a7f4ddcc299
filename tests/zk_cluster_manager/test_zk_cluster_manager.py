"""The cluster manager on a real ZooKeeper: joining, spreading, failover, preferred and forced partitions."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from testkit import read_jsonl

from waltz_engine.zk.cluster import create_cluster, next_server_id
from waltz_engine.zk.cluster_manager import (
    ClusterManager,
    ClusterManagerError,
    ClusterState,
    ClusterWatcher,
    ManagedServer,
    read_forced_assignments,
)
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import PartitionAssignment, PartitionInfo, ServerDescriptor

SESSION_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
WAIT_TIMEOUT_S = 20.0
HOST = "localhost"
JAVA_SERVER_PORT = 57180  # the port of the server in the vectors
VECTOR_ROOT = "/vectors"


@contextmanager
def kazoo_session(zookeeper: str) -> Iterator[KazooClient]:
    """One ZooKeeper session; stopping it early is how a test kills a server."""
    client = KazooClient(hosts=zookeeper, timeout=SESSION_TIMEOUT_S)
    client.start(timeout=CONNECT_TIMEOUT_S)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class Recorder:
    """Collects callback arguments and checks that each call ran on the event loop's thread."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.threads: set[int] = set()
        self.loop_thread = threading.get_ident()

    def __call__(self, argument: Any) -> None:
        # Recorded, not asserted here: the manager logs (and survives) exceptions from callbacks.
        self.threads.add(threading.get_ident())
        self.calls.append(argument)

    def called_in_loop(self) -> bool:
        return bool(self.calls) and self.threads == {self.loop_thread}


@asynccontextmanager
async def running_server(
    client: KazooClient, root: str, port: int, preferred: tuple[int, ...] = (), seed: int = 0
) -> AsyncIterator[tuple[ClusterManager, int, Recorder]]:
    recorder = Recorder()
    manager = ClusterManager(client, root, rng=random.Random(seed))
    await manager.start()
    try:
        server_id = await manager.manage(ManagedServer(HOST, port, recorder, preferred))
        yield manager, server_id, recorder
    finally:
        await manager.close()


def owned(state: ClusterState, server_id: int) -> dict[int, int]:
    """partition → generation for one server."""
    for server in state.assignment.servers:
        if server.server_id == server_id:
            return {info.partition_id: info.generation for info in server.partitions}
    return {}


def layout(*expected: tuple[int, int]) -> Callable[[ClusterState], bool]:
    """A state with exactly these live servers holding these many partitions each."""
    wanted = dict(expected)

    def check(state: ClusterState) -> bool:
        live = {member.server_id for member in state.members}
        return live == set(wanted) and all(len(owned(state, s)) == n for s, n in wanted.items())

    return check


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), WAIT_TIMEOUT_S * 3))


def test_join_spread_and_coordinator_failover(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    create_cluster(zk_client, cluster_root, "test", 6)

    async def scenario() -> None:
        endpoints, removed = Recorder(), Recorder()
        with kazoo_session(zookeeper) as client_a, kazoo_session(zookeeper) as client_b:
            async with (
                ClusterWatcher(
                    zk_client, cluster_root, on_endpoints=endpoints, on_server_removed=removed
                ) as watcher,
                running_server(client_a, cluster_root, 6001) as (manager_a, id_a, calls_a),
            ):
                alone = await manager_a.wait_for_state(layout((id_a, 6)), WAIT_TIMEOUT_S)
                assert owned(alone, id_a) == dict.fromkeys(range(6), 1)
                assert sorted(calls_a.calls[-1]) == [PartitionInfo(p, 1) for p in range(6)]

                async with running_server(client_b, cluster_root, 6002) as (manager_b, id_b, calls_b):
                    assert id_a < id_b  # a coordinates
                    spread = await manager_b.wait_for_state(layout((id_a, 3), (id_b, 3)), WAIT_TIMEOUT_S)
                    assert owned(spread, id_a) == dict.fromkeys(owned(spread, id_a), 1)  # stayed: kept
                    assert owned(spread, id_b) == dict.fromkeys(owned(spread, id_b), 2)  # moved: +1
                    assert sorted(calls_b.calls[-1]) == sorted(
                        PartitionInfo(p, g) for p, g in owned(spread, id_b).items()
                    )
                    await watcher.wait_for_state(layout((id_a, 3), (id_b, 3)), WAIT_TIMEOUT_S)
                    assert set(endpoints.calls[-1]) == {f"{HOST}:6001", f"{HOST}:6002"}

                    client_a.stop()  # the coordinator dies: its session and ephemeral znode end
                    survivor = await manager_b.wait_for_state(layout((id_b, 6)), WAIT_TIMEOUT_S)
                    kept = owned(spread, id_b)
                    for partition_id, generation in owned(survivor, id_b).items():
                        assert generation == kept.get(partition_id, 2)  # or came from a: 1 + 1
                    await watcher.wait_for_state(layout((id_b, 6)), WAIT_TIMEOUT_S)
                    assert removed.calls == [f"{HOST}:6001"]
                    assert all(r.called_in_loop() for r in (calls_a, calls_b, endpoints, removed))
                    assert endpoints.calls[-1] == {
                        f"{HOST}:6002": list(survivor.assignment.servers[0].partitions)
                    }

    run(scenario)


def test_preferred_partitions_and_unmanage(zookeeper: str, zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "test", 6)
    paths = ClusterPaths.of(cluster_root)

    async def scenario() -> None:
        with kazoo_session(zookeeper) as client_a, kazoo_session(zookeeper) as client_b:
            async with running_server(client_a, cluster_root, 6001) as (manager_a, id_a, _):
                await manager_a.wait_for_state(layout((id_a, 6)), WAIT_TIMEOUT_S)
                async with running_server(client_b, cluster_root, 6002, preferred=(0, 1, 2)) as (
                    manager_b,
                    id_b,
                    _,
                ):
                    state = await manager_b.wait_for_state(layout((id_a, 3), (id_b, 3)), WAIT_TIMEOUT_S)
                    assert set(owned(state, id_b)) == {0, 1, 2}

                    stat_before = zk_client.get(paths.server_descriptors)[1]
                    await manager_b.set_preferred_partitions((3, 4, 5))
                    state = await manager_b.wait_for_state(
                        lambda s: set(owned(s, id_b)) == {3, 4, 5} and layout((id_a, 3), (id_b, 3))(s),
                        WAIT_TIMEOUT_S,
                    )
                    assert owned(state, id_b) == {3: 2, 4: 2, 5: 2} and owned(state, id_a) == {
                        0: 3,
                        1: 3,
                        2: 3,
                    }
                    descriptor_data, descriptor_stat = zk_client.get(descriptor_node(zk_client, paths, id_b))
                    assert ServerDescriptor.from_bytes(descriptor_data).preferred_partitions == (3, 4, 5)
                    assert descriptor_stat.version == 1  # set in place, as the original (vector moment e)
                    _, stat = zk_client.get(paths.server_descriptors)
                    assert (
                        stat.version == stat_before.version + 1 and state.assignment.cversion == stat.cversion
                    )

                    await manager_b.unmanage()
                    state = await manager_a.wait_for_state(layout((id_a, 6)), WAIT_TIMEOUT_S)
                    assert owned(state, id_a) == {0: 3, 1: 3, 2: 3, 3: 3, 4: 3, 5: 3}

    run(scenario)


def descriptor_node(client: KazooClient, paths: ClusterPaths, server_id: int) -> str:
    for child in client.get_children(paths.server_descriptors):
        path = f"{paths.server_descriptors}/{child}"
        if ServerDescriptor.from_bytes(client.get(path)[0]).server_id == server_id:
            return path
    raise AssertionError(f"no descriptor for server {server_id}")


def assert_generations_follow(before: ClusterState, after: ClusterState) -> None:
    """Between two consecutive assignments: kept where a partition stayed, +1 where it moved."""
    for server in after.assignment.servers:
        for info in server.partitions:
            stayed = owned(before, server.server_id).get(info.partition_id)
            if stayed is not None:
                assert info.generation == stayed
            else:
                old = {i.partition_id: i.generation for s in before.assignment.servers for i in s.partitions}
                assert info.generation == old[info.partition_id] + 1


def test_forced_assignment_is_honoured_until_removed(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    create_cluster(zk_client, cluster_root, "test", 4)

    async def scenario() -> None:
        with (
            kazoo_session(zookeeper) as client_a,
            kazoo_session(zookeeper) as client_b,
            kazoo_session(zookeeper) as client_c,
        ):
            async with (
                running_server(client_a, cluster_root, 6001) as (manager_a, id_a, _),
                running_server(client_b, cluster_root, 6002) as (_, id_b, _),
                ClusterWatcher(zk_client, cluster_root) as operator,
            ):
                before = await manager_a.wait_for_state(layout((id_a, 2), (id_b, 2)), WAIT_TIMEOUT_S)
                taken = min(owned(before, id_a))
                assert await operator.forced_assign(taken, id_b)
                assert not await operator.forced_assign(taken, id_b)  # already so: nothing written
                first = await manager_a.wait_for_state(lambda s: taken in owned(s, id_b), WAIT_TIMEOUT_S)
                assert layout((id_a, 2), (id_b, 2))(first)
                assert_generations_follow(before, first)

                # Forcing more than the even spread allows: b gets all three, a keeps one.
                forced = sorted({taken, *owned(first, id_b)})[:3]
                if len(forced) < 3:
                    forced.append(min(set(range(4)) - set(forced)))
                for partition_id in forced:
                    await operator.forced_assign(partition_id, id_b)
                assert read_forced_assignments(zk_client, cluster_root) == dict.fromkeys(forced, id_b)
                over = await manager_a.wait_for_state(
                    lambda s: set(owned(s, id_b)) == set(forced), WAIT_TIMEOUT_S
                )
                assert layout((id_a, 1), (id_b, 3))(over)

                async with running_server(client_c, cluster_root, 6003) as (_, id_c, _):
                    joined = await manager_a.wait_for_state(
                        lambda s: s.assignment.num_endpoints == 3, WAIT_TIMEOUT_S
                    )
                    assert set(owned(joined, id_b)) == set(forced)  # still forced after a membership change
                    assert owned(joined, id_c) == {}
                left = await manager_a.wait_for_state(layout((id_a, 1), (id_b, 3)), WAIT_TIMEOUT_S)

                for partition_id in forced:
                    assert await manager_a.forced_unassign(partition_id)
                assert not await manager_a.forced_unassign(forced[0])
                assert read_forced_assignments(zk_client, cluster_root) == {}
                balanced = await manager_a.wait_for_state(layout((id_a, 2), (id_b, 2)), WAIT_TIMEOUT_S)
                assert set(owned(left, id_a)) <= set(
                    owned(balanced, id_a)
                )  # rebalancing moves only what it must
                for server_id in (id_a, id_b):
                    for partition_id, generation in owned(balanced, server_id).items():
                        stayed = owned(left, server_id).get(partition_id)
                        assert stayed is None or generation == stayed

    run(scenario)


# --- byte compatibility with the Java original (vector moments c0, c, d, e) --------------------


def _vector_moment(vectors: Path, moment: str) -> dict[str, dict[str, Any]]:
    records = read_jsonl(vectors / "zk" / "znodes.jsonl")
    return {r["path"][len(VECTOR_ROOT) :]: r for r in records if r["moment"] == moment}


def test_java_written_assignment_and_descriptor_are_read_back(
    zookeeper: str, zk_client: KazooClient, cluster_root: str, vectors: Path
) -> None:
    """Moment d: the Java server 2 re-joined (child version 3); a watcher reports exactly its partitions."""
    java = _vector_moment(vectors, "d")
    create_cluster(zk_client, cluster_root, "vectors", 4)
    paths = ClusterPaths.of(cluster_root)
    descriptor_hex = java["/serverDescriptors/s_0000000001"]["hex"]
    with kazoo_session(zookeeper) as java_server:
        first = java_server.create(paths.server_descriptor_prefix, b"", ephemeral=True, sequence=True)
        java_server.delete(first)  # the first Java server's life: child version 1, then 2
        java_server.create(
            paths.server_descriptor_prefix, bytes.fromhex(descriptor_hex), ephemeral=True, sequence=True
        )
        zk_client.set(paths.server_descriptors, bytes.fromhex(java["/serverDescriptors"]["hex"]))
        assert zk_client.get(paths.server_descriptors)[1].cversion == java["/serverDescriptors"]["cversion"]
        endpoints = Recorder()

        async def scenario() -> None:
            async with ClusterWatcher(zk_client, cluster_root, on_endpoints=endpoints) as watcher:
                state = await watcher.wait_for_state(lambda s: bool(s.members), WAIT_TIMEOUT_S)
                expected = PartitionAssignment.from_bytes(bytes.fromhex(java["/serverDescriptors"]["hex"]))
                assert state.assignment == expected
                assert state.members == (ServerDescriptor(2, HOST, JAVA_SERVER_PORT, ()),)
                assert endpoints.calls == [
                    {f"{HOST}:{JAVA_SERVER_PORT}": list(expected.servers[0].partitions)}
                ]

        run(scenario)


def test_our_server_writes_the_java_znodes_of_moments_c0_and_e(
    zookeeper: str, zk_client: KazooClient, cluster_root: str, vectors: Path
) -> None:
    """Same bytes and stats as the Java server wrote, except the (random) order of partitions."""
    moment_c0, moment_e = _vector_moment(vectors, "c0"), _vector_moment(vectors, "e")
    create_cluster(zk_client, cluster_root, "vectors", 4)
    paths = ClusterPaths.of(cluster_root)

    def znode(path: str) -> tuple[bytes, Any]:
        data, stat = zk_client.get(path)
        return data, stat

    def same_stat(stat: Any, java: dict[str, Any]) -> None:
        assert (stat.version, stat.cversion) == (java["version"], java["cversion"])

    def same_assignment(data: bytes, java: dict[str, Any]) -> None:
        ours, theirs = (
            PartitionAssignment.from_bytes(data),
            PartitionAssignment.from_bytes(bytes.fromhex(java["hex"])),
        )
        assert len(data) * 2 == len(java["hex"])
        assert ours.cversion == theirs.cversion and ours.num_partitions == theirs.num_partitions
        assert [(s.server_id, sorted(s.partitions)) for s in ours.servers] == [
            (s.server_id, sorted(s.partitions)) for s in theirs.servers
        ]

    async def scenario() -> None:
        with kazoo_session(zookeeper) as client:
            async with running_server(client, cluster_root, JAVA_SERVER_PORT) as (manager, server_id, _):
                assert server_id == 1
                await manager.wait_for_state(layout((1, 4)), WAIT_TIMEOUT_S)
                node = descriptor_node(zk_client, paths, 1)
                assert node.endswith("/s_0000000000")
                data, stat = znode(node)
                assert data.hex() == moment_c0["/serverDescriptors/s_0000000000"]["hex"]
                data, stat = znode(paths.server_descriptors)
                same_stat(stat, moment_c0["/serverDescriptors"])
                same_assignment(data, moment_c0["/serverDescriptors"])
                data, stat = znode(paths.server_ids)
                assert data.hex() == moment_c0["/ids/server"]["hex"]

        # Moment d/e: the first server is gone (its session ended), server 2 starts and prefers 1 and 3.
        with kazoo_session(zookeeper) as client:
            async with running_server(client, cluster_root, JAVA_SERVER_PORT) as (manager, server_id, _):
                assert server_id == 2
                state = await manager.wait_for_state(layout((2, 4)), WAIT_TIMEOUT_S)
                assert owned(state, 2) == dict.fromkeys(range(4), 2)
                await manager.set_preferred_partitions((1, 3))
                await manager.wait_for_state(
                    lambda s: s.version == moment_e["/serverDescriptors"]["version"], WAIT_TIMEOUT_S
                )
                data, stat = znode(descriptor_node(zk_client, paths, 2))
                assert data.hex() == moment_e["/serverDescriptors/s_0000000001"]["hex"]
                same_stat(stat, moment_e["/serverDescriptors/s_0000000001"])
                data, stat = znode(paths.server_descriptors)
                same_stat(stat, moment_e["/serverDescriptors"])
                same_assignment(data, moment_e["/serverDescriptors"])

    run(scenario)
    assert next_server_id(zk_client, cluster_root) == 3


def test_a_lost_descriptor_is_recreated_with_the_same_server_id(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    """As after a session expiry (the original's onConnected): same id, new sequential znode."""
    create_cluster(zk_client, cluster_root, "test", 2)
    paths = ClusterPaths.of(cluster_root)

    async def scenario() -> None:
        with kazoo_session(zookeeper) as client:
            async with running_server(client, cluster_root, 6001) as (manager, server_id, _):
                first = await manager.wait_for_state(layout((server_id, 2)), WAIT_TIMEOUT_S)
                lost = descriptor_node(zk_client, paths, server_id)
                zk_client.delete(lost)
                again = await manager.wait_for_state(lambda s: s.version > first.version, WAIT_TIMEOUT_S)
                assert layout((server_id, 2))(again)
                assert owned(again, server_id) == owned(first, server_id)  # it never moved
                recreated = descriptor_node(zk_client, paths, server_id)
                assert recreated > lost and manager.server_id == server_id

    run(scenario)


def test_invalid_requests_are_refused(zookeeper: str, zk_client: KazooClient, cluster_root: str) -> None:
    create_cluster(zk_client, cluster_root, "test", 2)

    async def scenario() -> None:
        manager = ClusterManager(zk_client, cluster_root)
        with pytest.raises(ClusterManagerError, match="not running"):
            await manager.manage(ManagedServer(HOST, 6001, Recorder()))
        async with running_server(zk_client, cluster_root, 6001) as (manager, _, _):
            with pytest.raises(ClusterManagerError, match="already manages"):
                await manager.manage(ManagedServer(HOST, 6002, Recorder()))
            with pytest.raises(ClusterManagerError, match="out of range"):
                await manager.set_preferred_partitions((2,))
            with pytest.raises(ClusterManagerError, match="out of range"):
                await manager.forced_assign(-1, 1)
            with pytest.raises(ClusterManagerError, match="server id 0"):
                await manager.forced_assign(0, 0)
            await manager.unmanage()
            with pytest.raises(ClusterManagerError, match="no managed server"):
                await manager.unmanage()

    run(scenario)
