"""The ZooKeeper side of replica moves, on the session's real ZooKeeper: the batched assignment
write (the original's bytes, one write), the recorded moves (a re-run keeps them), the lease (one
holder; only the holder releases it) and the group-aware choice of targets."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient

from waltz_engine.ops.decommission import DecommissionError, decommission
from waltz_engine.storage.admin_ops import StoreLayout, client_ssl_context, read_store_layout
from waltz_engine.storage.replica_mover import MoveError, ReplicaMover, plan_moves, settled_moves, under_way
from waltz_engine.zk import replica_moves
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.replica_moves import REASON_AUTO_RECOVERY, ReplicaMove
from waltz_engine.zk.store_metadata import (
    add_storage_node,
    assign_partitions,
    change_replicas,
    unassign_partitions,
)

NODES = ("h:1", "h:2", "h:3", "h:4")


def make_cluster(zk: KazooClient, root: str) -> None:
    create_cluster(zk, root, "moves", 4)
    for i, node in enumerate(NODES):
        add_storage_node(zk, root, node, 0, 1000 + i)
    assign_partitions(zk, root, "h:1", [0, 1, 2])
    assign_partitions(zk, root, "h:2", [0, 1, 3])


def test_change_replicas_writes_the_original_bytes_once(zk_client: KazooClient, cluster_root: str) -> None:
    make_cluster(zk_client, cluster_root)
    other_root = cluster_root + "-original"
    make_cluster(zk_client, other_root)
    # The original's tools, one change at a time.
    assign_partitions(zk_client, other_root, "h:3", [1, 2])
    unassign_partitions(zk_client, other_root, "h:1", [1])
    path = ClusterPaths.of(cluster_root).assignment
    _, before = zk_client.get(path)
    change_replicas(zk_client, cluster_root, [("h:3", 1), ("h:3", 2)], [("h:1", 1)])
    ours, after = zk_client.get(path)
    assert ours == zk_client.get(ClusterPaths.of(other_root).assignment)[0]
    assert after.version == before.version + 1
    # Done again (a re-run after a kill): no write at all.
    change_replicas(zk_client, cluster_root, [("h:3", 1), ("h:3", 2)], [("h:1", 1)])
    assert zk_client.get(path)[1].version == after.version


def test_recorded_moves_keep_the_first_move_of_a_partition(zk_client: KazooClient, cluster_root: str) -> None:
    make_cluster(zk_client, cluster_root)
    first = ReplicaMove(0, "h:1", "h:3")
    replica_moves.add_moves(zk_client, cluster_root, [first])
    again = [ReplicaMove(0, "h:1", "h:4"), ReplicaMove(2, "h:1", "h:4", REASON_AUTO_RECOVERY, True)]
    recorded = replica_moves.add_moves(zk_client, cluster_root, again)
    assert recorded == [first, again[1]]
    assert replica_moves.read_moves(zk_client, cluster_root) == recorded
    replica_moves.finish_move(zk_client, cluster_root, first)
    assert replica_moves.read_moves(zk_client, cluster_root) == [again[1]]


def test_a_move_left_to_tell_a_dead_node_lets_its_partition_move_again(
    zk_client: KazooClient, cluster_root: str
) -> None:
    make_cluster(zk_client, cluster_root)  # h:1 holds 0, 1, 2; h:2 holds 0, 1, 3
    # 0 moved from h:4, which never answered to be told (settled); 1 is still copying to h:3.
    settled, busy = ReplicaMove(0, "h:4", "h:1"), ReplicaMove(1, "h:2", "h:3")
    recorded = replica_moves.add_moves(zk_client, cluster_root, [settled, busy])
    layout = read_store_layout(zk_client, cluster_root)
    assert under_way(layout, recorded) == {1}
    assert settled_moves(layout, recorded) == [settled]
    planned = plan_moves(layout, "h:1", {"h:3", "h:4"}, reason="t", skip=under_way(layout, recorded))
    assert [m.partition_id for m in planned] == [0, 2]
    added = replica_moves.add_moves(zk_client, cluster_root, planned, settled_moves(layout, recorded))
    assert added == [settled, busy, *planned]


def test_a_move_back_onto_the_source_of_a_settled_move_drops_that_move(
    zk_client: KazooClient, cluster_root: str
) -> None:
    make_cluster(zk_client, cluster_root)  # h:1 holds 0, 1, 2; h:2 holds 0, 1, 3
    # 0 moved from h:3 to h:1, h:3 never told; now 0 moves from h:2 back onto h:3: run again,
    # the old move would take h:3 out of the assignment once more (issue 32).
    settled, other = ReplicaMove(0, "h:3", "h:1"), ReplicaMove(1, "h:4", "h:2")
    replica_moves.add_moves(zk_client, cluster_root, [settled, other])
    back = ReplicaMove(0, "h:2", "h:3")
    added = replica_moves.add_moves(zk_client, cluster_root, [back], [settled, other])
    assert added == [other, back]


def test_one_lease_holder_and_only_it_releases(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    make_cluster(zk_client, cluster_root)
    with connect(ZooKeeperSettings(zookeeper, cluster_root)) as other:
        assert replica_moves.try_lease(other, cluster_root, "other")
        assert not replica_moves.try_lease(zk_client, cluster_root, "me")
        replica_moves.release_lease(zk_client, cluster_root)  # not its holder: nothing happens
        assert replica_moves.lease_holder(zk_client, cluster_root) == "other"
    # The holder's session ended: the lease went with it.
    assert replica_moves.wait_lease(zk_client, cluster_root, "me", timeout_ms=10_000)
    assert replica_moves.lease_holder(zk_client, cluster_root) == "me"
    replica_moves.release_lease(zk_client, cluster_root)
    assert replica_moves.lease_holder(zk_client, cluster_root) is None


def layout(groups: dict[str, int], assignments: dict[str, tuple[int, ...]]) -> StoreLayout:
    return StoreLayout(uuid.uuid4(), 4, assignments, groups, {s: 1 for s in groups})


def test_targets_keep_replicas_in_distinct_groups_then_the_least_loaded() -> None:
    groups = {"a1": 1, "a2": 1, "b1": 2, "b2": 2, "c1": 3}
    assignments = {"a1": (0, 1), "a2": (), "b1": (0,), "b2": (1, 2, 3), "c1": (2,)}
    moves = plan_moves(layout(groups, assignments), "a1", set(groups) - {"a1"}, reason="test")
    # Partitions 0 and 1 have their other replica in group 2: a2 (the leaving node's group, not
    # used) wins over c1 (group 3, not used either) and over b-nodes (group 2, used).
    assert [(m.partition_id, m.target) for m in moves] == [(0, "a2"), (1, "a2")]
    spread = plan_moves(layout(groups, assignments), "b2", set(groups) - {"b2"}, reason="test")
    # Partition 2 has its other replica in group 3: b1 (the leaving node's group) over the less
    # loaded a2.
    assert {m.partition_id: m.target for m in spread}[2] == "b1"


def test_a_real_layout_plans_every_partition_of_the_node(zk_client: KazooClient, cluster_root: str) -> None:
    make_cluster(zk_client, cluster_root)
    planned = plan_moves(read_store_layout(zk_client, cluster_root), "h:1", set(NODES) - {"h:1"}, reason="t")
    assert [m.partition_id for m in planned] == [0, 1, 2]
    assert all(m.target in ("h:3", "h:4") for m in planned)  # h:2 holds 0 and 1; the empty ones first


def test_decommission_refuses_an_unknown_node_and_a_held_lease(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    make_cluster(zk_client, cluster_root)
    settings = ZooKeeperSettings(zookeeper, cluster_root)
    with pytest.raises(MoveError, match="h:9 is not in the replica assignment"):
        decommission(settings, client_ssl_context(None), "h:9")
    assert replica_moves.try_lease(zk_client, cluster_root, "server 3 (h:7)")
    with pytest.raises(
        DecommissionError, match=r"another process moves replicas now \(server 3 \(h:7\)\); add --wait"
    ):
        decommission(settings, client_ssl_context(None), "h:1")
    assert replica_moves.read_moves(zk_client, cluster_root) == []  # nothing recorded without the lease


def test_a_move_is_not_caught_up_when_no_other_replica_answers() -> None:
    import asyncio

    layout = StoreLayout(uuid.UUID(int=1), 1, {"h:1": (0,), "h:2": (0,), "h:3": (0,)}, {}, {})

    class Silent(ReplicaMover):
        async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
            return 5 if storage == "h:3" else None  # only the target answers

    mover = Silent(None, "/root", None)  # type: ignore[arg-type]
    with pytest.raises(MoveError, match="no other replica answers"):
        asyncio.run(mover._await_caught_up(layout, ReplicaMove(0, "h:1", "h:3")))
