"""The ZooKeeper side of replica moves, on the session's real ZooKeeper: the batched assignment
write (the original's bytes, one write), the recorded moves (a re-run keeps them), the lease (one
holder; only the holder releases it) and the group-aware choice of targets."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Collection

import pytest
from kazoo.client import KazooClient, KazooState

from waltz_engine.ops.decommission import DecommissionError, decommission
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import NodePartitions, StoreLayout, client_ssl_context, read_store_layout
from waltz_engine.storage.admin_ops.recovery import RecoveryResult
from waltz_engine.storage.replica_mover import (
    MoveError,
    ReplicaMover,
    holders,
    plan_moves,
    recorded_quorum_gap,
    settled_moves,
    under_way,
)
from waltz_engine.zk import replica_moves
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.java_io import JavaHashMap
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK, PartitionMetadata, ReplicaId, ReplicaState
from waltz_engine.zk.replica_moves import REASON_AUTO_RECOVERY, ReplicaMove
from waltz_engine.zk.store_metadata import (
    add_storage_node,
    assign_partitions,
    change_replicas,
    read_partition_metadata,
    unassign_partitions,
    write_partition_metadata,
)

NODES = ("h:1", "h:2", "h:3", "h:4")
# How long a test waits for a ZooKeeper session to start or to be renewed.
SESSION_WAIT_S = 30


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


def expire_session(zookeeper: str, client: KazooClient) -> None:
    """End ``client``'s ZooKeeper session from outside (as the server does when it misses the
    client past the session timeout) and wait until kazoo has gone on in a new session."""
    assert client.client_id is not None
    old_session = client.client_id[0]
    renewed = threading.Event()

    def on_state(state: str) -> None:
        session = client.client_id
        if state == KazooState.CONNECTED and session is not None and session[0] != old_session:
            renewed.set()

    client.add_listener(on_state)
    try:
        twin = KazooClient(hosts=zookeeper, client_id=client.client_id)
        twin.start(timeout=SESSION_WAIT_S)
        twin.stop()  # closing the session the twin shares ends it: its ephemerals go
        twin.close()
        assert renewed.wait(SESSION_WAIT_S), "kazoo did not go on in a new session"
    finally:
        client.remove_listener(on_state)


def test_a_mover_whose_session_expired_stops_before_changing_the_assignment(
    zookeeper: str, zk_client: KazooClient, cluster_root: str
) -> None:
    """The fence (issue 32, the simulator's seed 60055): a decommission's session expired while
    it waited; another mover took the lease; the decommission, in kazoo's new session, went on
    and took its source out of the assignment and off the node while the other assigned it there:
    4 replicas, one node refusing every session. A mover checks its lease before each change."""
    make_cluster(zk_client, cluster_root)  # h:1 holds 0, 1, 2; h:2 holds 0, 1, 3
    settings = ZooKeeperSettings(zookeeper, cluster_root)

    class Waited(ReplicaMover):
        # The target is assigned and caught up: what is left is taking the source out.
        async def _await_caught_up(self, layout: StoreLayout, move: ReplicaMove) -> None:
            return None

        async def _await_recorded_quorum(self, layout: StoreLayout, move: ReplicaMove) -> None:
            return None

    move = ReplicaMove(0, "h:1", "h:2")
    with connect(settings) as mover_zk, connect(settings) as other:
        assert replica_moves.try_lease(mover_zk, cluster_root, "decommission h:1")
        replica_moves.add_moves(mover_zk, cluster_root, [move])
        assert replica_moves.holds_lease(mover_zk, cluster_root)
        expire_session(zookeeper, mover_zk)
        assert replica_moves.try_lease(other, cluster_root, "server 1 (h:9)")
        assert not replica_moves.holds_lease(mover_zk, cluster_root)
        context = read_store_layout(zk_client, cluster_root).context(client_ssl_context(None), 2_000)
        mover = Waited(mover_zk, cluster_root, context)
        with pytest.raises(replica_moves.LeaseLostError, match=r"now held by server 1 \(h:9\)"):
            asyncio.run(mover.run(move))
        after = read_store_layout(zk_client, cluster_root)
        assert sorted(holders(after, 0)) == ["h:1", "h:2"]  # the source stays assigned
        assert replica_moves.read_moves(zk_client, cluster_root) == [move]  # left for a re-run
        assert replica_moves.lease_holder(zk_client, cluster_root) == "server 1 (h:9)"


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

    mover = Silent(None, "/root", None, catch_up_timeout_ms=0)  # type: ignore[arg-type]
    with pytest.raises(MoveError, match="no other replica answers"):
        asyncio.run(mover._await_caught_up(layout, ReplicaMove(0, "h:1", "h:3")))


def test_a_rerun_move_is_not_finished_before_its_catch_up_is_judged() -> None:
    """A move whose target replaced an unreachable source in place, its catch-up wait failed: the
    re-run (target assigned, source not) judged nothing and released the source, calling it moved
    (a diagnosis of the simulator's seeds 3006 and 4704)."""
    import asyncio

    layout = StoreLayout(uuid.UUID(int=1), 1, {"h:2": (0,), "h:3": (0,), "h:4": (0,)}, {}, {})
    released: list[ReplicaMove] = []

    class Rerun(ReplicaMover):
        async def layout(self) -> StoreLayout:
            return layout

        async def _await_caught_up(self, layout: StoreLayout, move: ReplicaMove) -> None:
            raise MoveError("h:4 holds up to 10, not 13")

        async def _release(self, layout: StoreLayout, move: ReplicaMove) -> bool:
            released.append(move)
            return False

    mover = Rerun(None, "/root", None)  # type: ignore[arg-type]
    with pytest.raises(MoveError, match="not 13"):
        asyncio.run(mover.run(ReplicaMove(0, "h:1", "h:4")))
    assert released == []  # the source keeps its files until the target is judged caught up


def test_a_move_is_not_caught_up_on_the_answer_of_a_lagging_replica_alone() -> None:
    """The simulator's seed 387: h:1 leaves for h:4; h:1 and h:3 hold the tail (committed up to
    98) but refuse the question mid-session, and only h:2, lagging at 10, answers. The target at
    10 is not caught up on that answer: the source would leave with 11..98 on h:3 alone."""
    import asyncio

    layout = StoreLayout(uuid.UUID(int=1), 1, {"h:1": (0,), "h:2": (0,), "h:3": (0,), "h:4": (0,)}, {}, {})
    answers: dict[str, int | None] = {"h:1": None, "h:2": 10, "h:3": None, "h:4": 10}

    class Refused(ReplicaMover):
        async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
            return answers[storage]

    mover = Refused(None, "/root", None, catch_up_timeout_ms=0)  # type: ignore[arg-type]
    move = ReplicaMove(0, "h:1", "h:4")
    with pytest.raises(MoveError, match=r"only h:2 of h:1, h:2, h:3 answer .* fewer than a quorum"):
        asyncio.run(mover._await_caught_up(layout, move))
    answers["h:3"] = 98  # a quorum answers: the goal is the tail, the target must reach it
    with pytest.raises(MoveError, match="h:4 holds up to 10, not 98"):
        asyncio.run(mover._await_caught_up(layout, move))
    answers["h:4"] = 98
    asyncio.run(mover._await_caught_up(layout, move))


def test_a_move_is_not_caught_up_on_a_minority_of_the_others_answers() -> None:
    # The simulator's seeds 1215 and 2433: storage-0 and storage-1 held the committed tail
    # (0..13) in a store session newer than their admin ports reported, so both refused the
    # max-txid question; storage-2, which lagged (9), alone answered, and the target, at 10,
    # was called caught up: the source left with 11..13.
    layout = StoreLayout(uuid.UUID(int=1), 1, {"h:0": (0,), "h:1": (0,), "h:2": (0,), "h:3": (0,)}, {}, {})
    answers = {"h:2": 9, "h:3": 10}

    class Refusing(ReplicaMover):
        async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
            return answers.get(storage)

    mover = Refusing(None, "/root", None, catch_up_timeout_ms=0)  # type: ignore[arg-type]
    move = ReplicaMove(0, "h:1", "h:3")
    with pytest.raises(MoveError, match="fewer than a quorum"):
        asyncio.run(mover._await_caught_up(layout, move))
    # A majority of the others answering includes a holder of every committed transaction.
    answers["h:0"] = 13
    with pytest.raises(MoveError, match="holds up to 10, not 13"):
        asyncio.run(mover._await_caught_up(layout, move))
    answers["h:3"] = 13
    asyncio.run(mover._await_caught_up(layout, move))


def test_a_move_waits_for_the_others_answers_refused_while_a_recovery_runs() -> None:
    """The simulator's seed 963: a decommission re-run assigned its target beside the source, which
    opens a store session; while its recovery ran, two of the three others refused the max-txid
    question (their sessions moved past what their admin ports report) and the move failed at
    once, leaving 4 replicas assigned. It waits for the answers as it waits for the catch-up."""
    import asyncio

    layout = StoreLayout(uuid.UUID(int=1), 1, {"h:0": (0,), "h:1": (0,), "h:2": (0,), "h:3": (0,)}, {}, {})
    asked: list[str] = []

    class Recovering(ReplicaMover):
        async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
            asked.append(storage)
            if storage in ("h:0", "h:2") and asked.count(storage) <= 2:
                return None  # refused: the servers' recovery has not completed yet
            return 99

    mover = Recovering(None, "/root", None, catch_up_timeout_ms=10_000)  # type: ignore[arg-type]
    asyncio.run(mover._await_caught_up(layout, ReplicaMove(0, "h:0", "h:3")))
    assert asked.count("h:0") == 3 and asked.count("h:3") == 1  # asked until they answered
    # Never answering, it still fails (and the move stays recorded), after the timeout.
    asked.clear()

    class Silent(Recovering):
        async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
            asked.append(storage)
            return None if storage in ("h:0", "h:2") else 99

    silent = Silent(None, "/root", None, catch_up_timeout_ms=300)  # type: ignore[arg-type]
    with pytest.raises(MoveError, match=r"only h:1 of h:0, h:1, h:2 answer .* after 300 ms"):
        asyncio.run(silent._await_caught_up(layout, ReplicaMove(0, "h:0", "h:3")))
    assert asked.count("h:0") >= 2


# --- the replicas of record (issue 32: the simulator's seed 154) ---------------------------------

UNRESOLVED = UNRESOLVED_HIGH_WATER_MARK


def record_session(zk: KazooClient, root: str, session_id: int, states: dict[str, int]) -> None:
    """``store/partition/0`` as a store session's completed recovery leaves it: the replicas it
    recorded, each clean (unresolved) in the session ``states`` gives."""
    metadata, version = read_partition_metadata(zk, root, 0)
    recorded: JavaHashMap[ReplicaId, ReplicaState] = JavaHashMap(ReplicaId.java_hash)
    for storage, state_session in states.items():
        replica = ReplicaId(0, storage)
        recorded.put(replica, ReplicaState(replica, state_session, UNRESOLVED))
    write_partition_metadata(zk, root, 0, PartitionMetadata.of_map(1, session_id, recorded), version)


class Nodes(ReplicaMover):
    """A mover over nodes that answer as told: the copy and the release always succeed, every
    replica holds nothing (nothing committed yet), and each node took part last in the store
    session ``sessions`` gives (-1: never, or reset when it was unassigned)."""

    sessions: dict[str, int]
    down: set[str]

    async def copy(self, layout: StoreLayout, move: ReplicaMove) -> None:
        return None

    async def node(self, layout: StoreLayout, storage: str) -> NodePartitions | None:
        return None if storage in self.down else NodePartitions(layout.admin_address(storage), [], storage)

    async def _max_txid(self, layout: StoreLayout, storage: str, p: int) -> int | None:
        return None if storage in self.down else -1

    async def _session_of(self, layout: StoreLayout, p: int, storage: str) -> int | None:
        return None if storage in self.down else self.sessions[storage]

    async def _release(self, layout: StoreLayout, move: ReplicaMove) -> bool:
        return move.source not in self.down


def nodes_mover(zk: KazooClient, root: str, sessions: dict[str, int], down: Collection[str] = ()) -> Nodes:
    """A mover under the lease, as every mover runs (it checks the lease before each change)."""
    assert replica_moves.try_lease(zk, root, "test mover") or replica_moves.holds_lease(zk, root)
    mover = Nodes(zk, root, None, say=lambda line: None, catch_up_timeout_ms=300)  # type: ignore[arg-type]
    mover.sessions, mover.down = sessions, set(down)
    return mover


def run_past_the_recording(
    zk: KazooClient,
    root: str,
    mover: ReplicaMover,
    move: ReplicaMove,
    session_id: int,
    states: dict[str, int],
) -> bool:
    """``move`` run with the source taken out: it ends only once a store session recorded the
    replicas without the source (until then each one that stays is needed: one lost in that
    window left the partition waiting for it, the operator's day's `kill -9` right after a
    decommission). No server records one here: the move fails after its timeout and stays
    recorded; ``states`` recorded as that session's recovery would, it is run again."""
    with pytest.raises(MoveError, match=f"no store session recorded the replicas without {move.source}"):
        asyncio.run(mover.run(move))
    assert move.source not in holders(read_store_layout(zk, root), 0)
    assert move in replica_moves.read_moves(zk, root)
    record_session(zk, root, session_id, states)
    return asyncio.run(mover.run(move))


def five_nodes(zk: KazooClient, root: str, holding: tuple[str, ...]) -> tuple[str, ...]:
    nodes = tuple(f"h:{i}" for i in range(1, 6))
    create_cluster(zk, root, "moves", 1)
    for i, node in enumerate(nodes):
        add_storage_node(zk, root, node, 0, 1000 + i)
    change_replicas(zk, root, [(node, 0) for node in holding])
    return nodes


def test_a_move_keeps_its_source_until_a_store_session_records_a_voter_that_stays(
    zk_client: KazooClient, cluster_root: str
) -> None:
    """Seed 154's end: the last completed recovery recorded h:1, h:2 and h:3 in session 0, and no
    session completed since; h:1 and h:2 have since been moved away and back (unassigning reset
    their nodes' session to -1), so h:3 is the one replica of record that votes. Taking it out
    left a recovery that never resolves: the replicas of record that stay do not vote."""
    five_nodes(zk_client, cluster_root, ("h:1", "h:2", "h:3"))
    record_session(zk_client, cluster_root, 0, {"h:1": 0, "h:2": 0, "h:3": 0})
    sessions = {"h:1": -1, "h:2": -1, "h:3": 0, "h:4": -1, "h:5": -1}
    move = ReplicaMove(0, "h:3", "h:4")
    replica_moves.add_moves(zk_client, cluster_root, [move])
    mover = nodes_mover(zk_client, cluster_root, sessions)
    with pytest.raises(
        MoveError, match=r"h:3 cannot leave yet: h:1, h:2 of .* that stay were reset since, or are silent"
    ):
        asyncio.run(mover.run(move))
    layout = read_store_layout(zk_client, cluster_root)
    assert holders(layout, 0) == ["h:1", "h:2", "h:3", "h:4"], "the source stays beside its target"
    assert replica_moves.read_moves(zk_client, cluster_root) == [move]

    # The servers' recovery of a session with the four (the assignment change opened one)
    # records them; the move, run again, takes the source out.
    record_session(zk_client, cluster_root, 4, {"h:1": 4, "h:2": 4, "h:3": 4, "h:4": 4})
    mover.sessions = {**sessions, "h:1": 4, "h:2": 4, "h:3": 4, "h:4": 4}
    assert run_past_the_recording(zk_client, cluster_root, mover, move, 5, {"h:1": 5, "h:2": 5, "h:4": 5})
    assert holders(read_store_layout(zk_client, cluster_root), 0) == ["h:1", "h:2", "h:4"]
    assert replica_moves.read_moves(zk_client, cluster_root) == []


def test_a_live_source_leaves_a_bare_quorum_of_record_only_once_its_target_is_recorded(
    zk_client: KazooClient, cluster_root: str
) -> None:
    """The simulator's seed 2159: the last completed recovery recorded h:1, h:2 and h:3 (session 0),
    and h:3's decommission onto h:4 ran while no server could open a session (the owner cut off).
    Taking h:3 out then left h:1 and h:2 as the only replicas of record: with either down, the
    next recovery could not decide, and two of the three assigned replicas up committed nothing
    (44 s in the seed, for good had the node's disk been lost). The source stays beside its target
    until a session's recovery records the target; then one of the four may be down."""
    five_nodes(zk_client, cluster_root, ("h:1", "h:2", "h:3"))
    record_session(zk_client, cluster_root, 0, {"h:1": 0, "h:2": 0, "h:3": 0})
    sessions = {"h:1": 0, "h:2": 0, "h:3": 0, "h:4": -1, "h:5": -1}
    move = ReplicaMove(0, "h:3", "h:4")
    replica_moves.add_moves(zk_client, cluster_root, [move])
    mover = nodes_mover(zk_client, cluster_root, sessions)
    bare = r"h:3 cannot leave yet: h:4 is not of record yet .* a bare quorum of 2"
    with pytest.raises(MoveError, match=bare):
        asyncio.run(mover.run(move))
    assert holders(read_store_layout(zk_client, cluster_root), 0) == ["h:1", "h:2", "h:3", "h:4"]
    assert replica_moves.read_moves(zk_client, cluster_root) == [move]

    # The servers' recovery of a session with the four records h:4; the move, run again, ends.
    record_session(zk_client, cluster_root, 1, {"h:1": 1, "h:2": 1, "h:3": 1, "h:4": 1})
    mover.sessions = {**sessions, "h:1": 1, "h:2": 1, "h:3": 1, "h:4": 1}
    assert run_past_the_recording(zk_client, cluster_root, mover, move, 2, {"h:1": 2, "h:2": 2, "h:4": 2})
    assert holders(read_store_layout(zk_client, cluster_root), 0) == ["h:1", "h:2", "h:4"]


def test_an_unreachable_source_is_replaced_in_place_only_while_a_quorum_of_record_stays(
    zk_client: KazooClient, cluster_root: str
) -> None:
    """h:3 was replaced in place by h:4 (unreachable then) and no store session completed since:
    the replicas of record are still h:1, h:2 and h:3. h:2 is unreachable now; replaced in place
    by h:5, only h:1 of them would stay, and no recovery could ever decide (h:2 back would not
    be assigned to report). h:5 joins beside h:2 instead, which stays."""
    five_nodes(zk_client, cluster_root, ("h:1", "h:2", "h:4"))
    record_session(zk_client, cluster_root, 0, {"h:1": 0, "h:2": 0, "h:3": 0})
    sessions = {"h:1": 0, "h:2": 0, "h:3": 0, "h:4": -1, "h:5": -1}
    move = ReplicaMove(0, "h:2", "h:5")
    replica_moves.add_moves(zk_client, cluster_root, [move])
    mover = nodes_mover(zk_client, cluster_root, sessions, down={"h:2"})
    with pytest.raises(
        MoveError, match=r"h:2 cannot leave yet: 1 of the replicas .* fewer than a quorum of 2"
    ):
        asyncio.run(mover.run(move))
    assert holders(read_store_layout(zk_client, cluster_root), 0) == ["h:1", "h:2", "h:4", "h:5"]

    # Where a quorum of record stays with a voter among it, the unreachable source goes at once.
    record_session(zk_client, cluster_root, 1, {"h:1": 1, "h:2": 0, "h:4": 1})
    other = ReplicaMove(0, "h:2", "h:3")
    change_replicas(zk_client, cluster_root, (), [("h:5", 0)])
    replica_moves.finish_move(zk_client, cluster_root, move)
    replica_moves.add_moves(zk_client, cluster_root, [other])
    mover.sessions = {**sessions, "h:1": 1, "h:4": 1}
    recorded = {"h:1": 2, "h:3": 2, "h:4": 2}
    # Left to tell h:2 when it answers.
    assert not run_past_the_recording(zk_client, cluster_root, mover, other, 2, recorded)
    assert holders(read_store_layout(zk_client, cluster_root), 0) == ["h:1", "h:3", "h:4"]


def test_the_replicas_of_record_that_stay_decide_the_next_recovery() -> None:
    async def gap(
        states: dict[str, tuple[int, int]], staying: set[str], sessions: dict[str, int]
    ) -> str | None:
        recorded: JavaHashMap[ReplicaId, ReplicaState] = JavaHashMap(ReplicaId.java_hash)
        for storage, (session_id, closing) in states.items():
            recorded.put(ReplicaId(0, storage), ReplicaState(ReplicaId(0, storage), session_id, closing))

        async def session_of(storage: str) -> int | None:
            return sessions.get(storage)

        return await recorded_quorum_gap(PartitionMetadata.of_map(1, 5, recorded), staying, session_of)

    clean = {"h:1": (3, UNRESOLVED), "h:2": (3, UNRESOLVED), "h:3": (3, UNRESOLVED)}
    live = {"h:1": 3, "h:2": 3, "h:3": 4, "h:4": -1}
    assert asyncio.run(gap({}, {"h:4"}, {})) is None  # no recovery completed yet: -1, any replicas
    assert asyncio.run(gap(clean, {"h:1", "h:2", "h:4"}, live)) is None
    assert "fewer than a quorum of 2" in str(asyncio.run(gap(clean, {"h:1", "h:4"}, live)))
    # Reset since (session -1 < 3) or silent: fewer than a quorum say what they hold.
    closed = {**clean, "h:2": (2, 7)}
    reset = asyncio.run(gap(closed, {"h:1", "h:2", "h:4"}, {"h:1": -1, "h:4": 3}))
    assert reset is not None and "h:1, h:2 of" in reset and "reset since, or are silent" in reset
    assert asyncio.run(gap(closed, {"h:1", "h:2", "h:4"}, {"h:1": 3})) is not None  # h:2 silent
    assert asyncio.run(gap(closed, {"h:1", "h:2", "h:4"}, {"h:1": 3, "h:2": 2})) is None
    # Truncated to a closing mark, it says what it holds but does not vote: none votes.
    both_closed = {**closed, "h:1": (2, 7)}
    no_voter = asyncio.run(gap(both_closed, {"h:1", "h:2", "h:4"}, {"h:1": 2, "h:2": 2}))
    assert no_voter is not None and "none of h:1, h:2 that stay" in no_voter
    # The simulator's seed 22045: a voter stays beside a replica moved away and back (reset):
    # one of them says what it holds, fewer than a quorum; the recovery would wait for good.
    moved_back = asyncio.run(gap(clean, {"h:1", "h:2", "h:4"}, {"h:1": -1, "h:2": 3}))
    assert moved_back is not None and "h:1 of" in moved_back

    # A source that answers and leaves beside its target h:4 (seed 2159): a bare quorum of record
    # would stay, so it waits for h:4 to be recorded, unless more than a quorum of record stays.
    async def leaving_gap(states: dict[str, tuple[int, int]], staying: set[str]) -> str | None:
        recorded: JavaHashMap[ReplicaId, ReplicaState] = JavaHashMap(ReplicaId.java_hash)
        for storage, (session_id, closing) in states.items():
            recorded.put(ReplicaId(0, storage), ReplicaState(ReplicaId(0, storage), session_id, closing))

        async def session_of(storage: str) -> int | None:
            return live.get(storage)

        metadata = PartitionMetadata.of_map(1, 5, recorded)
        return await recorded_quorum_gap(metadata, staying, session_of, "h:4")

    bare = asyncio.run(leaving_gap(clean, {"h:1", "h:2", "h:4"}))
    assert bare is not None and "h:4 is not of record yet" in bare
    five = {**clean, "h:5": (3, UNRESOLVED), "h:6": (3, UNRESOLVED)}
    live.update({"h:5": 3, "h:6": 3})
    assert asyncio.run(leaving_gap(five, {"h:1", "h:2", "h:5", "h:6", "h:4"})) is None  # 4 of 5 stay
    with_target = {**clean, "h:4": (4, UNRESOLVED)}
    live["h:4"] = 4
    assert asyncio.run(leaving_gap(with_target, {"h:1", "h:2", "h:4"})) is None  # 3 of 4, h:4 of them
    live["h:4"] = -1  # h:4's node reset since (moved away and back): its record says nothing
    assert asyncio.run(leaving_gap(with_target, {"h:1", "h:2", "h:4"})) is not None


# The simulator's seed 213: the last recovery (session 2) recorded h:1, h:3, h:4 clean, h:2 at its
# closing mark 52; 53 and 54 were committed on h:1, h:3, h:4.
SEED_213_RECORD = {"h:1": (2, UNRESOLVED), "h:2": (1, 52), "h:3": (2, UNRESOLVED), "h:4": (2, UNRESOLVED)}


def test_a_move_does_not_cut_a_target_of_record_that_is_no_longer_assigned(
    zk_client: KazooClient, cluster_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 213 went on: h:1 (no longer assigned, its node still in session 5, holding up to 54)
    became the target of h:4's move, copied from h:3, which held up to 52; the copy, free to cut
    a target it took for no replica, truncated h:1 to 52. Recorded clean in session 2, h:1 still
    counts in the next recovery, so its copy must refuse to cut what the source cannot give."""
    create_cluster(zk_client, cluster_root, "moves", 1)
    for i, node in enumerate(("h:1", "h:2", "h:3", "h:4", "h:5")):
        add_storage_node(zk_client, cluster_root, node, 0, 1000 + i)
    change_replicas(zk_client, cluster_root, [(node, 0) for node in ("h:2", "h:3", "h:4")])
    metadata, version = read_partition_metadata(zk_client, cluster_root, 0)
    recorded: JavaHashMap[ReplicaId, ReplicaState] = JavaHashMap(ReplicaId.java_hash)
    for storage, (session_id, closing) in SEED_213_RECORD.items():
        recorded.put(ReplicaId(0, storage), ReplicaState(ReplicaId(0, storage), session_id, closing))
    write_partition_metadata(zk_client, cluster_root, 0, PartitionMetadata.of_map(1, 2, recorded), version)
    cuts: dict[str, bool] = {}

    async def recover_partition(*args: object, cut_above_source: bool, **kwargs: object) -> RecoveryResult:
        target = str(args[2])
        cuts[target] = cut_above_source
        return RecoveryResult(0, 5, 52, 52, 52, 0, 1)

    async def nothing(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(admin_ops, "recover_partition", recover_partition)
    monkeypatch.setattr(admin_ops, "add_partitions", nothing)
    monkeypatch.setattr(admin_ops, "set_availability", nothing)
    mover = nodes_mover(zk_client, cluster_root, {"h:1": 5, "h:2": 1, "h:3": -1, "h:4": 5, "h:5": -1})

    async def from_h3(layout: StoreLayout, move: ReplicaMove) -> str:
        return "h:3"  # the seed's source: it held up to 52

    monkeypatch.setattr(mover, "_copy_source", from_h3)
    layout = read_store_layout(zk_client, cluster_root)
    target_admin = {node: str(layout.admin_address(node)) for node in ("h:1", "h:5")}

    asyncio.run(ReplicaMover.copy(mover, layout, ReplicaMove(0, "h:4", "h:1")))
    assert cuts[target_admin["h:1"]] is False, "a replica of record's records are not cut"
    asyncio.run(ReplicaMover.copy(mover, layout, ReplicaMove(0, "h:4", "h:5")))
    assert cuts[target_admin["h:5"]] is True, "a node of no record counts toward no quorum"
    mover.sessions["h:1"] = -1  # reset since: the next recovery counts only its low-water mark
    asyncio.run(ReplicaMover.copy(mover, layout, ReplicaMove(0, "h:4", "h:1")))
    assert cuts[target_admin["h:1"]] is True
