"""The server's lone-append path (``Partition._append_now`` -> ``StorePartition.append_lone``) on
three real storage nodes: an append taken at once is decided by a call, its batch encoded from
its entry and written to the replicas from the read callback. Its invariants are the general
path's: a second append never overtakes one that waits (for its locks here), a FLUSH is answered
behind them, an answer other than SUCCESS rolls the session and the next appends go on through
the general path, and a lone batch in flight when its session fails is decided by the
successor's recovery from what the log holds.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from server_support.engine_harness import TestClient, append, req
from storage_node_support import StorageNodeProcess
from store_cluster_support import (
    StorageCluster,
    bounded,
    caught_up,
    node_connect_string,
    open_store,
    read_all,
    registered_nodes,
    stoppable_cluster,
    wait_until,
)

from waltz_engine.common.crc import crc32
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import connect, serve
from waltz_engine.net.tls import TlsConfig, client_context, server_context
from waltz_engine.server.config import EngineSettings
from waltz_engine.server.handler import ClientHandler
from waltz_engine.server.server import ServerCore
from waltz_engine.server.store import Store, StorePartition
from waltz_engine.server.store.config import StoreConfig
from waltz_engine.server.store.queued_appends import FAILED_TRANSACTION_ID
from waltz_engine.server.store.replica_session import MAX_DIRECT_IN_FLIGHT, ReplicaSession
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
)
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT, SERVER_HELLO_TEXT
from waltz_engine.zk.payloads import PartitionInfo

NUM_NODES = 3
NUM_PARTITIONS = 3
GENERATION = 1
CLIENT_ID = 11
LOCK = 77
# How long an append must stay undecided while two of three nodes are stopped.
NOT_DECIDED_PROBE_S = 0.5


@pytest.fixture
def cluster(zookeeper: str, tmp_path: Path) -> Iterator[StorageCluster]:
    with stoppable_cluster(zookeeper, tmp_path, NUM_NODES, NUM_PARTITIONS) as storage_cluster:
        yield storage_cluster


@pytest.fixture
def zk(cluster: StorageCluster, zookeeper: str) -> Iterator[KazooClient]:
    with registered_nodes(cluster, zookeeper) as client:
        yield client


class Outcomes:
    """A lone append's ``on_decided`` calls, by seq num."""

    def __init__(self) -> None:
        self.decided: dict[int, tuple[int, BaseException | None]] = {}
        self.changed = asyncio.Event()

    def append_lone(self, partition: StorePartition, seq: int) -> bool:
        data = f"lone-{seq}".encode()

        def on_decided(transaction_id: int, error: BaseException | None, _last: bool) -> None:
            assert seq not in self.decided, "decided twice"
            self.decided[seq] = (transaction_id, error)
            self.changed.set()

        req_id = ReqId(CLIENT_ID, GENERATION, partition.partition_id, seq)
        return partition.append_lone(req_id, 0, data, crc32(data), on_decided)

    async def wait(self, seq: int) -> tuple[int, BaseException | None]:
        async def until() -> tuple[int, BaseException | None]:
            while seq not in self.decided:
                self.changed.clear()
                await self.changed.wait()
            return self.decided[seq]

        return await bounded(until())


def test_an_append_behind_one_that_waits_for_its_locks_does_not_overtake_it(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """A takes the lone path and holds a write lock while two nodes are stopped; B wants the same
    lock (it waits, through the queue); C, no locks, is read while B waits and must not take the
    lone path past it; the FLUSH behind them is answered with all three."""
    partition_id = 0
    one, two = cluster.nodes[1], cluster.nodes[2]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        core = ServerCore(
            store,
            EngineSettings(feed_cache_size_bytes=1 << 20, transaction_data_cache_size_bytes=1 << 20),
            MetricsRegistry(),
        )
        server = await serve(
            "127.0.0.1",
            0,
            server_context(TlsConfig()),
            CLIENT_CODECS,
            SERVER_HELLO_TEXT,
            ClientHandler(core),
            "t",
        )
        await core.set_partitions([PartitionInfo(partition_id, GENERATION)])
        conn = await connect(
            "127.0.0.1",
            server.sockets[0].getsockname()[1],
            client_context(TlsConfig()),
            {4: CLIENT_CODECS[4]},
            CLIENT_HELLO_TEXT,
        )
        client = TestClient(conn)
        try:
            partition = core.partition(partition_id)
            assert partition is not None
            await wait_until(lambda: partition.ready, "the partition ready")
            await client.send(MountRequest(req(CLIENT_ID, 0, partition_id), -1, 0))
            await client.receive_until(MountResponse)
            await client.send(append(req(CLIENT_ID, 0, partition_id), -1, b"warm-up"))
            await client.send(FlushRequest(req(CLIENT_ID, 0, partition_id)))
            assert (await client.receive_until(FlushResponse))[-1].transaction_id == 0
            # Every replica idle and caught up before two are stopped, as in the tests below: an
            # answer to the warm-up still in flight to a stopped node is another case.
            session = store.partition(partition_id)._manager.current_session
            assert session is not None
            await wait_until(
                lambda: all(r._parked and r.next_transaction_id == 1 for r in session.replica_sessions),
                "every replica idle",
            )
            os.kill(one.pid, signal.SIGSTOP)
            os.kill(two.pid, signal.SIGSTOP)
            # Each alone in its write: recognised by its bytes, handled in the read callback.
            await client.send(append(req(CLIENT_ID, 1, partition_id), 0, b"A", write=(LOCK,)))
            await wait_until(lambda: partition.pending_appends == 1, "A taken at once")
            await client.send(append(req(CLIENT_ID, 2, partition_id), 1000, b"B", write=(LOCK,)))
            await wait_until(lambda: partition.append_queue_size() == 0, "B taken by the append task")
            await asyncio.sleep(NOT_DECIDED_PROBE_S)
            assert partition.pending_appends == 1, "B waits for A's lock"
            await client.send(append(req(CLIENT_ID, 3, partition_id), 0, b"C"))
            await client.send(FlushRequest(req(CLIENT_ID, 3, partition_id)))
            await asyncio.sleep(NOT_DECIDED_PROBE_S)
            assert partition.pending_appends == 1, "C waits behind B"
            os.kill(one.pid, signal.SIGCONT)
            os.kill(two.pid, signal.SIGCONT)
            assert (await client.receive_until(FlushResponse))[-1].transaction_id == 3
            headers = await bounded(partition.record_headers(0, 10))
            assert [h.req_id.seq_num for h in headers] == [0, 1, 2, 3]
        finally:
            for node in (one, two):
                os.kill(node.pid, signal.SIGCONT)
            await client.close()
            server.close()
            await core.close()
            await store.close()

    asyncio.run(go())


def test_an_answer_other_than_success_rolls_the_session_and_appends_go_on(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """One node refuses the lone batch (its partition made unavailable): the two others commit it,
    the refusal rolls the session, the next append waits for the new one (the general path)."""
    partition_id = 1
    refusing = cluster.nodes[2]
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition, outcomes = await _first_lone_commit(store, partition_id, storages)
            session = partition.status()["session"]
            assert isinstance(session, dict)
            await refusing.with_admin(lambda admin: admin.set_partition_available([partition_id], False))
            assert outcomes.append_lone(partition, 1)
            assert await outcomes.wait(1) == (1, None), "a quorum wrote it"
            await wait_until(
                lambda: not partition.healthy or _session_id(partition) != session["session_id"], "roll"
            )
            await refusing.with_admin(lambda admin: admin.set_partition_available([partition_id], True))
            # The refusal rolled the session: no lone path until the new one serves.
            taken = outcomes.append_lone(partition, 2)
            future = None
            if not taken:
                data = b"lone-2"
                req_id = ReqId(CLIENT_ID, GENERATION, partition_id, 2)
                future = await partition.append(req_id, 0, data, crc32(data))
            transaction_id = await bounded(future) if future is not None else (await outcomes.wait(2))[0]
            assert transaction_id == 2
            assert _session_id(partition) > session["session_id"]
            await wait_until(
                lambda: caught_up(partition.status(), storages), "the refusing replica caught up"
            )
            await _assert_every_log(cluster, partition_id, _session_id(partition), 3)
        finally:
            await store.close()

    asyncio.run(go())


def test_a_lone_batch_in_flight_when_its_session_fails_is_decided_by_the_recovery(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """Two nodes stopped with a lone batch in flight, then killed: the session fails undecided;
    once they are back the successor's recovery decides it from the log, and the outcome is what
    the log holds."""
    partition_id = 2
    first = cluster.nodes[0]
    stopped = cluster.nodes[1:]
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition, outcomes = await _first_lone_commit(store, partition_id, storages)
            for node in stopped:
                os.kill(node.pid, signal.SIGSTOP)
            assert outcomes.append_lone(partition, 1)
            await asyncio.sleep(NOT_DECIDED_PROBE_S)
            assert 1 not in outcomes.decided, "one node of three decides nothing"
            for node in stopped:
                node.kill()
            for node in stopped:
                await asyncio.to_thread(node.start)
            transaction_id, error = await outcomes.wait(1)
            assert error is None
            await wait_until(lambda: caught_up(partition.status(), storages), "replicas caught up again")
            log = [r.req_id.seq_num for r in await read_all(first, partition_id, _session_id(partition), 10)]
            if transaction_id == FAILED_TRANSACTION_ID:
                assert log == [0], "a failed append is in no log"
            else:
                assert transaction_id == 1 and log == [0, 1]
            # The partition goes on, at once, after it.
            assert outcomes.append_lone(partition, 2)
            assert await outcomes.wait(2) == (len(log), None)
        finally:
            await store.close()

    asyncio.run(go())


async def _first_lone_commit(
    store: Store, partition_id: int, storages: list[str]
) -> tuple[StorePartition, Outcomes]:
    """The store's partition, open with every replica caught up, and its first lone append
    committed (at txid 0)."""
    partition = store.partition(partition_id)
    await partition.set_generation(GENERATION)
    await bounded(partition.ensure_open())
    await wait_until(lambda: caught_up(partition.status(), storages), "replicas caught up")
    outcomes = Outcomes()
    assert outcomes.append_lone(partition, 0)
    assert await outcomes.wait(0) == (0, None)
    return partition, outcomes


async def _assert_every_log(cluster: StorageCluster, partition_id: int, session_id: int, count: int) -> None:
    """Every node's log of the partition holds exactly the lone appends 0 .. ``count`` - 1, in order."""
    for node in cluster.nodes:
        records = await read_all(node, partition_id, session_id, count + 1)
        assert [r.req_id.seq_num for r in records] == list(range(count)), node


def _session_id(partition: StorePartition) -> int:
    session = partition.status()["session"]
    assert isinstance(session, dict)
    return int(session["session_id"])


def test_a_replica_slower_than_the_quorum_is_sent_the_next_batches_behind_its_unanswered_one(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """One node stopped: lone appends commit on the two others, one after another, and the
    stopped node's replica is sent each batch behind the ones it has not answered (in order on
    its connection), not made to miss them and catch up later, up to MAX_DIRECT_IN_FLIGHT; the
    batches past the bound wait for its task, which catches them up once the node answers. Its
    answers then vote, in order, with no roll of the session, and every log is the same."""
    partition_id = 0
    slow = cluster.nodes[2]
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        store = await open_store(zk, cluster.root, NO_MARKS_CONFIG)
        try:
            partition, outcomes, replica = await _commits_past_a_stopped_replica(
                store, partition_id, storages, slow, PAST_THE_BOUND
            )
            session_id = _session_id(partition)
            try:
                unanswered = [batch.first_transaction_id for batch in replica._direct]
                # Each sent behind the last, up to the bound.
                assert unanswered == list(range(1, MAX_DIRECT_IN_FLIGHT + 1))
                assert replica.next_transaction_id == 1
            finally:
                os.kill(slow.pid, signal.SIGCONT)
            end = PAST_THE_BOUND + 1
            await wait_until(lambda: replica.next_transaction_id == end, "the slow replica caught up")
            assert not replica._direct
            assert _session_id(partition) == session_id, "no roll: nothing abstained before its decision"
            await _assert_every_log(cluster, partition_id, session_id, end)
        finally:
            await store.close()

    asyncio.run(go())


def test_a_slow_replica_that_fails_with_batches_unanswered_abstains_them_and_the_log_goes_on(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """One node stopped with three batches sent to it behind each other, then killed: its replica
    session abstains every unanswered one (all decided by the other two already) and ends; the
    idle session rolls, and once the node is back it catches up to the same log, and appends go on."""
    partition_id = 1
    slow = cluster.nodes[2]
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        store = await open_store(zk, cluster.root, NO_MARKS_CONFIG)
        try:
            partition, outcomes, replica = await _commits_past_a_stopped_replica(
                store, partition_id, storages, slow, 3
            )
            session_id = _session_id(partition)
            assert len(replica._direct) == 3
            slow.kill()
            await wait_until(lambda: replica.closed, "the slow replica's session ends")
            assert not replica._direct, "its unanswered batches abstained"
            await wait_until(lambda: _session_id(partition) != session_id, "the idle session rolls")
            await asyncio.to_thread(slow.start)
            await wait_until(lambda: caught_up(partition.status(), storages), "the slow replica caught up")
            taken = outcomes.append_lone(partition, 4)
            if not taken:
                data = b"lone-4"
                future = await partition.append(
                    ReqId(CLIENT_ID, GENERATION, partition_id, 4), 0, data, crc32(data)
                )
                assert await bounded(future) == 4
            else:
                assert await outcomes.wait(4) == (4, None)
            await _assert_every_log(cluster, partition_id, _session_id(partition), 5)
        finally:
            await store.close()

    asyncio.run(go())


# No low-water marks: a mark due holds a batch back for the replica's task (by design), which
# the tests of batches sent behind unanswered ones must not meet.
NO_MARKS_CONFIG = StoreConfig(
    initial_retry_interval_ms=20, max_retry_interval_ms=200, low_water_mark_interval_ms=0
)


# Lone appends past a stopped replica: three more than its unanswered batches' bound.
PAST_THE_BOUND = MAX_DIRECT_IN_FLIGHT + 3


async def _commits_past_a_stopped_replica(
    store: Store, partition_id: int, storages: list[str], slow: StorageNodeProcess, count: int
) -> tuple[StorePartition, Outcomes, ReplicaSession]:
    """The partition's first lone commit, then ``slow`` stopped (SIGSTOP; the cluster fixture
    resumes it at the end) once its replica session idles caught up (parked: batches may go
    from the store session's call), then lone appends 1 to ``count``, each committed by the
    other two before the next. Returns the partition, the outcomes and the slow replica's session."""
    partition, outcomes = await _first_lone_commit(store, partition_id, storages)
    session = partition._manager.current_session
    assert session is not None
    (replica,) = [r for r in session.replica_sessions if r.storage == node_connect_string(slow)]
    await wait_until(lambda: replica._parked and replica.next_transaction_id == 1, "the replica idle")
    os.kill(slow.pid, signal.SIGSTOP)
    for seq in range(1, count + 1):
        assert outcomes.append_lone(partition, seq), "taken at once"
        assert await outcomes.wait(seq) == (seq, None), "the two others commit it"
    return partition, outcomes, replica


def test_an_append_taken_while_a_lone_batch_is_in_flight_goes_in_the_next_batch_after_it(
    cluster: StorageCluster, zk: KazooClient
) -> None:
    """Two nodes stopped with a lone batch in flight: the appends taken meanwhile wait in the
    session's queue (no batch of theirs leaves before the one in flight is decided), then go as
    the next batch from the decision's call, in order, at the next txids; a flush behind them is
    answered with all of them."""
    partition_id = 0
    stopped = cluster.nodes[1:]
    storages = [node_connect_string(node) for node in cluster.nodes]

    async def go() -> None:
        store = await open_store(zk, cluster.root)
        try:
            partition, outcomes = await _first_lone_commit(store, partition_id, storages)
            session = partition._manager.current_session
            assert session is not None
            await wait_until(
                lambda: all(r._parked and r.next_transaction_id == 1 for r in session.replica_sessions),
                "every replica idle",
            )
            order: list[int] = []
            outcomes.changed = _Recording(outcomes, order)
            for node in stopped:
                os.kill(node.pid, signal.SIGSTOP)
            try:
                assert outcomes.append_lone(partition, 1)
                await asyncio.sleep(0)  # the batch of 1 leaves at the end of its turn
                assert outcomes.append_lone(partition, 2) and outcomes.append_lone(partition, 3)
                flushed = asyncio.ensure_future(partition.flush())
                await asyncio.sleep(NOT_DECIDED_PROBE_S)
                assert not outcomes.decided.keys() - {0} and not flushed.done()
                assert session.num_pending_appends == 3
                assert len(session._queue) == 2, "the appends behind wait in the session's queue"
            finally:
                for node in stopped:
                    os.kill(node.pid, signal.SIGCONT)
            assert await bounded(flushed) == 3
            assert [outcomes.decided[seq] for seq in (1, 2, 3)] == [(1, None), (2, None), (3, None)]
            assert order == [1, 2, 3]
            await wait_until(lambda: caught_up(partition.status(), storages), "replicas caught up")
            await _assert_every_log(cluster, partition_id, _session_id(partition), 4)
        finally:
            await store.close()

    asyncio.run(go())


class _Recording(asyncio.Event):
    """``Outcomes.changed`` that also notes the order of the decisions."""

    def __init__(self, outcomes: Outcomes, order: list[int]) -> None:
        super().__init__()
        self._outcomes = outcomes
        self._order = order

    def set(self) -> None:
        self._order.extend(seq for seq in self._outcomes.decided if seq not in self._order and seq)
        super().set()
