"""One store session of a partition (``StoreSessionImpl``): recovery, then replicated appends.

Appends queue up (at most ``QUEUE_CAPACITY_BATCHES`` batches); one batch at a time takes up to
``max_batch_size`` of them, gives them consecutive txids, is encoded once and handed to every
replica session. The batch commits when a quorum (n/2 + 1) has written it; any abstention closes
the session after that, and a failed vote closes it at once. Appends the session could not
decide are resolved by the next session against its resolved high-water mark.

No task runs the batches: an append to an idle session starts one at the end of the loop turn
(so the appends of that turn go together), and the vote that decides a batch resolves it and
starts the next with what queued meanwhile. Each was a task wake-up per commit before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from kazoo.client import KazooClient

from waltz_engine.common import clock
from waltz_engine.common.backoff import Backoff
from waltz_engine.common.loop_turns import call_at_turn_end
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.store.config import QUEUE_CAPACITY_BATCHES, StoreConfig
from waltz_engine.server.store.errors import (
    AppendOutcomeUnknownError,
    GenerationMismatchError,
    RecoveryFailedError,
    RetainedStartError,
    SessionClosedError,
    StoreError,
)
from waltz_engine.server.store.latency_router import MAX_LATENCY_MS, LatencyWeightedRouter
from waltz_engine.server.store.queued_appends import (
    FAILED_TRANSACTION_ID,
    QueuedAppend,
    StoreAppendRequest,
)
from waltz_engine.server.store.recovery import RecoveryManager
from waltz_engine.server.store.replica_connection import ReplicaConnection
from waltz_engine.server.store.replica_session import ReplicaSession, ReplicatedBatch
from waltz_engine.server.store.retained_start import retained_start_error
from waltz_engine.server.store.voting import Voting
from waltz_engine.storage.client import StorageRpcError, encode_append_batch
from waltz_engine.storage.segment import CORRUPT_RECORD_MESSAGE
from waltz_engine.zk.payloads import ReplicaId

log = logging.getLogger(__name__)

T = TypeVar("T")

COMMIT_ALL = 2**63 - 1
# Reads of the successor's records when deciding a failed session's batch (each may return part),
# retried after a pause while no replica can serve yet (about 10 s in all).
RESOLVE_READ_ATTEMPTS = 16
RESOLVE_RETRY_INITIAL_MS = 10
RESOLVE_RETRY_MAX_MS = 1_000
# Encoded batches kept for replicas that fell behind (under load the slowest of three
# replicas misses batches the other two committed): re-sending the bytes avoids reading the
# records back from another storage node and encoding them again. Bounded in bytes.
ENCODED_BATCHES_KEPT_BYTES = 4 * 1024 * 1024


class StoreSession:
    def __init__(
        self,
        partition_id: int,
        generation: int,
        session_id: int,
        config: StoreConfig,
        replica_sessions: list[ReplicaSession],
        zk_client: KazooClient,
        cluster_root: str,
    ) -> None:
        self.partition_id = partition_id
        self.generation = generation
        self.session_id = session_id
        self.replica_sessions = replica_sessions
        self.quorum = len(replica_sessions) // 2 + 1
        self._max_batch_size = config.max_batch_size
        self._queue_capacity = config.max_batch_size * QUEUE_CAPACITY_BATCHES
        self._queue: deque[QueuedAppend] = deque()
        self._in_flight: list[QueuedAppend] | None = None
        # first txid -> (encoded records, count) of the latest batches, oldest first.
        self._encoded_batches: dict[int, tuple[bytes, int]] = {}
        self._encoded_batches_bytes = 0
        self._num_pending = 0
        self._changed = asyncio.Event()  # queue, pending count or running state changed
        self._num_waiting = 0  # callers waiting on ``_changed``: without any, a change sets nothing
        self._running = True
        self.failed = False  # closed because a vote failed or a replica abstained
        self.on_failure: Callable[[StoreSession], None] | None = None
        self.low_water_mark = -1
        self._next_transaction_id = 0
        self._opened = False  # recovered: batches may start
        self._start_scheduled = False
        self._router: LatencyWeightedRouter[ReplicaSession] = LatencyWeightedRouter(replica_sessions)
        self._recovery: RecoveryManager | None = RecoveryManager(
            zk_client,
            cluster_root,
            partition_id,
            generation,
            session_id,
            self.quorum,
            [session.replica_id for session in replica_sessions],
        )

    # --- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Run recovery; the resolved high-water mark becomes this session's low-water mark."""
        recovery = self._recovery
        assert recovery is not None
        if not self.replica_sessions:
            self.close()
            raise StoreError(f"partition {self.partition_id}: not enough replicas (none assigned)")
        try:
            await recovery.start()
            for replica_session in self.replica_sessions:
                replica_session.open(recovery, self)
            self.low_water_mark = await recovery.high_water_mark()
            self._next_transaction_id = self.low_water_mark + 1
        except BaseException as e:
            self.close()
            # GeneratorExit: this coroutine is being closed (its task destroyed pending; in the
            # simulator, a dead machine's buried). Made a StoreError, the caller's retry loop went
            # on retrying in the closing coroutine, which can then only fail.
            if isinstance(e, RecoveryFailedError | asyncio.CancelledError | GeneratorExit):
                raise
            raise StoreError(f"partition {self.partition_id}: failed to recover: {e}") from e
        finally:
            self._recovery = None
        if not self._running:
            raise RecoveryFailedError("store session closed while recovering")
        self._opened = True
        self._start_soon()

    def close(self) -> None:
        if not self._running:
            return
        self._running = False
        if self._recovery is not None:
            self._recovery.abort(RecoveryFailedError("store session closed"))
        for replica_session in self.replica_sessions:
            replica_session.close()
        self._wake()

    async def wait_closed(self) -> None:
        for replica_session in self.replica_sessions:
            await replica_session.wait_closed()

    def _wake(self) -> None:
        # Three changes per commit, and almost never a waiter (a full queue, a FLUSH): a new
        # Event only when one is waiting on the current one.
        if self._num_waiting:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _wait_changed(self) -> None:
        self._num_waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._num_waiting -= 1

    @property
    def writable(self) -> bool:
        return self._running

    @property
    def high_water_mark(self) -> int:
        return self._next_transaction_id - 1

    @property
    def num_pending_appends(self) -> int:
        return self._num_pending

    # --- appends --------------------------------------------------------------------------------

    async def append(self, request: StoreAppendRequest) -> None:
        """Queue ``request`` (waiting while the queue is full)."""
        while self._running and len(self._queue) >= self._queue_capacity:
            await self._wait_changed()
        if not self._running:
            raise SessionClosedError(f"partition {self.partition_id}: store session {self.session_id} closed")
        if request.req_id.generation != self.generation:
            raise GenerationMismatchError(
                f"partition {self.partition_id}: request generation {request.req_id.generation} "
                f"!= {self.generation}"
            )
        self._queue.append(request)
        self._num_pending += 1
        self._wake()
        self._start_soon()

    def append_now(self, request: QueuedAppend) -> bool:
        """:meth:`append` when it needs no waiting (False: there is no room, or the session or
        generation changed; nothing was done). The batch starts at the end of the loop turn, as
        from :meth:`append`: starting it at once from here sent a batch of one under fan-in and
        made the rest of the burst wait a round trip and an fsync for the next (16 appenders on
        one partition: 28 % fewer commits per second). A lone appender's batch still leaves in
        its request's loop iteration: the read callback that ends the turn runs the start
        (``run_turn_end``)."""
        if (
            not self._running
            or len(self._queue) >= self._queue_capacity
            or request.req_id.generation != self.generation
        ):
            return False
        self._queue.append(request)
        self._num_pending += 1
        # (Both checks inline: every lone append comes here, and rarely does either act.)
        if self._num_waiting:
            self._wake()
        if not self._start_scheduled and self._in_flight is None:
            self._start_soon()
        return True

    async def flush(self) -> int:
        """Wait until every queued append is resolved; the high-water mark."""
        while self._num_pending > 0:
            if not self._running:
                raise SessionClosedError(
                    f"partition {self.partition_id}: store session {self.session_id} closed"
                )
            await self._wait_changed()
        return self.high_water_mark

    async def resolve_by(self, successor: StoreSession) -> None:
        """Called on this closed session by its recovered successor: decide every undecided append.

        An append of the batch in flight committed only if the successor's log holds that very
        request at the txid this session gave it: the slot may hold another owner's record (a
        server that lost the partition and got it back finds the records of the one in between
        there), so a high-water mark alone proves nothing. Appends still queued were never sent:
        certainly absent. Raises (leaving them undecided) when the successor cannot be read; the
        next session tries again.

        An append at a txid that retention removed since (the others committed it, the
        application consumed it, the operator's bound passed it) can never be read back: its
        outcome is unknown and stays so, and it fails with :class:`AppendOutcomeUnknownError`
        (the partition counts its locks as written there; its client learns the outcome from its
        feed, as always). Before, the read was retried with every new session, and the
        partition never opened again (issue 32, the simulator's bank seeds 218, 498 and 906).
        """
        assert not self._running, "only a closed session's appends are resolved by its successor"
        batch = self._in_flight or []
        first = self._next_transaction_id
        count = min(len(batch), successor.low_water_mark - first + 1)
        gone = 0  # the batch's first appends, at txids below the successor's retained start
        logged: list[ReqId] = []
        while gone < count:
            try:
                logged = await successor.logged_req_ids(first + gone, count - gone)
                break
            except RetainedStartError as e:
                assert e.retained_start > first + gone, (e.retained_start, first, gone)
                gone = min(count, e.retained_start - first)
        if self._in_flight is not batch and batch:
            return  # decided meanwhile (the partition closed: fail_all)
        self._in_flight = None
        for i, request in enumerate(batch):
            if i < gone:
                request.fail(
                    AppendOutcomeUnknownError(
                        f"partition {self.partition_id}: the outcome of append {request.req_id} "
                        f"(transaction {first + i} of session {self.session_id}) is unknown: "
                        "retention removed that transaction before it could be read back",
                        first + i,
                    )
                )
            elif i - gone < len(logged) and logged[i - gone] == request.req_id:
                request.commit(first + i)
                self._next_transaction_id = first + i + 1
            else:
                request.commit(FAILED_TRANSACTION_ID)
        for request in self._queue:
            request.commit(FAILED_TRANSACTION_ID)
        self._num_pending -= len(batch) + len(self._queue)
        assert self._num_pending == 0, self._num_pending
        self._queue.clear()
        self._wake()

    async def logged_req_ids(self, first_transaction_id: int, count: int) -> list[ReqId]:
        """The reqIds of the ``count`` records from ``first_transaction_id`` (all at or below the
        low-water mark this session recovered), read from a recovered replica."""
        assert first_transaction_id + count - 1 <= self.low_water_mark, (first_transaction_id, count)
        req_ids: list[ReqId] = []
        backoff = Backoff(RESOLVE_RETRY_INITIAL_MS, RESOLVE_RETRY_MAX_MS)
        for _ in range(RESOLVE_READ_ATTEMPTS):
            if len(req_ids) == count or not self._running:
                break
            try:
                # Right after recovery a replica may not count as recovered yet: then no replica
                # can serve, and the read is tried again shortly.
                headers = await self.record_headers(first_transaction_id + len(req_ids), count - len(req_ids))
            except SessionClosedError:
                await backoff.wait()
                continue
            for header in headers:
                if header.transaction_id != first_transaction_id + len(req_ids):
                    break
                req_ids.append(header.req_id)
        if len(req_ids) < count:
            raise SessionClosedError(
                f"partition {self.partition_id}: could not read the records "
                f"{first_transaction_id}..{first_transaction_id + count - 1} to decide the previous "
                "session's appends"
            )
        return req_ids

    def fail_all(self, error: BaseException) -> None:
        """The partition is closing: nobody will resolve these appends."""
        for request in [*(self._in_flight or ()), *self._queue]:
            request.fail(error)
        self._in_flight = None
        self._queue.clear()
        self._num_pending = 0
        self._wake()

    def _resolve_in_flight(self, high_water_mark: int) -> None:
        batch, self._in_flight = self._in_flight, None
        if batch is None:
            return
        # The batch's first appends, up to the mark, committed at consecutive txids; the rest failed.
        first = self._next_transaction_id
        count = len(batch)
        num_committed = max(0, min(count, high_water_mark - first + 1))
        self._next_transaction_id = first + num_committed
        self._num_pending -= count
        assert self._num_pending >= 0
        if self._num_waiting:
            self._wake()
        # The session's state is the batch's outcome already: the partition's callbacks (locks,
        # caches, the commit's feed, mounts and flushes behind it) run now, in order.
        last = count - 1
        for i, request in enumerate(batch):
            transaction_id = first + i if i < num_committed else FAILED_TRANSACTION_ID
            request.commit(transaction_id, eager=True, last_of_batch=i == last)

    def _start_soon(self) -> None:
        """Start a batch at the end of this loop turn, unless one is in flight or due."""
        if self._opened and self._in_flight is None and self._queue and not self._start_scheduled:
            self._start_scheduled = True
            # A read callback that ends its loop turn starts it at once (the same batch).
            call_at_turn_end(asyncio.get_running_loop(), self._start_due)

    def _start_due(self) -> None:
        self._start_scheduled = False
        if self._in_flight is None:
            self._start_batch()

    def _start_batch(self) -> None:
        """Hand the next batch to the replica sessions; its decision calls :meth:`_decided`."""
        if not self._running or not self._queue:
            return
        try:
            queue = self._queue
            count = min(len(queue), self._max_batch_size)
            if count == len(queue):  # (the whole queue, most often: no pop per append)
                batch = list(queue)
                queue.clear()
            else:
                batch = [queue.popleft() for _ in range(count)]
            assert self._in_flight is None, "one batch in flight per session"
            self._in_flight = batch
            if self._num_waiting:
                self._wake()  # room in the queue
            first = self._next_transaction_id
            # Encoded once for every replica, straight from the queue's entries (no records made).
            encoded = encode_append_batch(first, batch)
            replicas = self.replica_sessions
            num_voters = len([replica for replica in replicas if replica.is_voter])
            voting = Voting(self.quorum, num_voters, self._decided)
            # (The replicas' mark checks read the clock once for the batch, here.)
            replicated = ReplicatedBatch(first, encoded, count, voting, clock.monotonic_s())
            for replica in replicas:
                replica.append(replicated)
            # Kept after the sends (a replica's read of it waits for a loop turn at least): the
            # requests leave sooner by this bookkeeping.
            self._keep_encoded_batch(first, encoded, count)
        except Exception:
            log.exception("partition %d session %d: append failed", self.partition_id, self.session_id)
            self._close_failed()

    def _decided(self, voting: Voting) -> None:
        if not self._running:
            return  # closed meanwhile: the successor resolves the batch in flight
        if not voting.decision:
            log.warning("partition %d session %d: no quorum (%r)", self.partition_id, self.session_id, voting)
            self._close_failed()
            return
        self._resolve_in_flight(COMMIT_ALL)
        if voting.num_abstentions:  # (``has_abstention``, inline: every batch comes here)
            # A replica may have missed the batch: roll to a new session, which recovers it.
            self._close_failed()
            return
        if self._queue:  # (what came meanwhile; a lone commit's queue is empty)
            self._start_batch()

    def replica_failed(self, replica: ReplicaSession) -> None:
        """A replica session ended in an error after the recovery resolved. With appends in flight,
        their batch's abstention rolls the session. An idle session rolls now: otherwise the
        replica, maybe not recovered yet (`cluster verify` fails on it), waits for the next append
        (a smoke run ended so: a node's ZooKeeper session expired as it recovered a replica)."""
        if self._running and self._opened and self._num_pending == 0:
            log.info(
                "partition %d session %d: rolling the idle session to recover %s again",
                self.partition_id,
                self.session_id,
                replica.replica_id,
            )
            self._close_failed()

    def _close_failed(self) -> None:
        self.failed = True
        self.close()
        if self.on_failure is not None:
            self.on_failure(self)

    # --- reads ----------------------------------------------------------------------------------

    def _keep_encoded_batch(self, first_transaction_id: int, encoded: bytes, count: int) -> None:
        kept = self._encoded_batches
        kept[first_transaction_id] = (encoded, count)
        self._encoded_batches_bytes += len(encoded)
        while self._encoded_batches_bytes > ENCODED_BATCHES_KEPT_BYTES:
            oldest, _ = kept.pop(next(iter(kept)))
            self._encoded_batches_bytes -= len(oldest)

    def next_encoded_batch(self, transaction_id: int) -> int | None:
        """The first txid of the earliest kept encoded batch after ``transaction_id``, if any."""
        # Insertion order is txid order: batches are kept as they are formed.
        return next((first for first in self._encoded_batches if first > transaction_id), None)

    def committed_encoded_batch(self, transaction_id: int) -> tuple[bytes, int] | None:
        """The encoded records and count of a recent committed batch starting at ``transaction_id``."""
        batch = self._encoded_batches.get(transaction_id)
        if batch is None or transaction_id + batch[1] > self._next_transaction_id:
            return None
        return batch

    async def committed_records(
        self, transaction_id: int, max_records: int, exclude: ReplicaSession | None = None
    ) -> list[Record]:
        count = min(self._next_transaction_id - transaction_id, max_records)
        if count <= 0:
            return []
        return await self._read(
            transaction_id, lambda r: _connection_of(r).records(transaction_id, count), exclude
        )

    async def record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        count = min(self._next_transaction_id - transaction_id, max_records)
        if count <= 0:
            return []
        return await self._read(
            transaction_id, lambda r: _connection_of(r).record_headers(transaction_id, count)
        )

    async def record(self, transaction_id: int) -> Record | None:
        if transaction_id >= self._next_transaction_id:
            return None
        return await self._read(transaction_id, lambda r: _connection_of(r).record(transaction_id))

    async def _read(
        self,
        transaction_id: int,
        call: Callable[[ReplicaSession], Awaitable[T]],
        exclude: ReplicaSession | None = None,
    ) -> T:
        """From the replica of least expected latency that has the record; lagging ones are penalised."""
        rotten: list[ReplicaSession] = []  # answered "corrupt record" for this read: skipped
        # Answered "below the retained start": skipped too (another replica whose cleaner has
        # not run yet may still serve it); raised if no replica serves it.
        retained: RetainedStartError | None = None
        removed: list[ReplicaSession] = []
        unready: set[ReplicaId] = set()  # skipped while catching up, or failed: may still hold it
        for replica in self._read_order():
            if not self._running:
                break
            if replica is None:
                self.close()
                break
            if (
                replica is exclude
                or replica in rotten
                or replica in removed
                or transaction_id >= replica.next_transaction_id
                or not replica.recovered.is_set()
            ):
                if not replica.recovered.is_set():
                    unready.add(replica.replica_id)
                replica.update_expected_latency(MAX_LATENCY_MS)
                continue
            started_s = clock.monotonic_s()
            try:
                value = await call(replica)
            except StorageRpcError as e:
                below = retained_start_error(e)
                if below is not None:
                    # Retention removed it there: an answer, not a broken replica (closing it
                    # would roll the session on every such read).
                    if retained is None or below.retained_start > retained.retained_start:
                        retained = below
                    removed.append(replica)
                    continue
                if CORRUPT_RECORD_MESSAGE in str(e):
                    # Rot on that replica's disk: the record is read from another one; the
                    # replica stays (its other records are good).
                    log.warning("read from %s refused, reading elsewhere: %s", replica.replica_id, e)
                    rotten.append(replica)
                    replica.update_expected_latency(MAX_LATENCY_MS)
                    continue
                log.warning("read from %s failed: %s", replica.replica_id, e)
                unready.add(replica.replica_id)
                replica.close()
                continue
            replica.update_expected_latency((clock.monotonic_s() - started_s) * 1000)
            return value
        unready.difference_update(replica.replica_id for replica in removed)
        if retained is not None and not unready:
            # Final: the records are gone (a read of them never succeeds later), so callers
            # must not retry it (``StorePartition`` passes it on; issue 32's stalled feeds).
            raise retained
        if retained is not None:
            # Not final while a replica not asked may still hold it (one catching up after the
            # session opened, or one whose read failed): the caller asks again.
            raise SessionClosedError(
                f"partition {self.partition_id}: transaction {transaction_id} is below the retained "
                f"start on the replicas asked; {', '.join(sorted(map(str, unready)))} not asked yet"
            )
        raise SessionClosedError(
            f"partition {self.partition_id}: no replica can serve transaction {transaction_id}"
        )

    def _read_order(self) -> Iterator[ReplicaSession | None]:
        """The replicas a read tries, in turn: the router's weighted draws (None: no route), then
        each replica once more, since draws may miss the one replica that still holds a record
        the others' retention removed (an answer that must not be given while it holds it)."""
        for _ in range(len(self.replica_sessions) * 2):
            replica = self._router.get_route()
            yield replica
            if replica is None:
                return
        yield from list(self.replica_sessions)

    def status(self) -> dict[str, object]:
        hwm = self.high_water_mark
        replicas = []
        for replica in self.replica_sessions:
            info = replica.status()
            max_txid = replica.next_transaction_id - 1 if replica.recovered.is_set() else None
            info["max_transaction_id"] = max_txid
            info["lag"] = None if max_txid is None else hwm - max_txid
            replicas.append(info)
        return {
            "session_id": self.session_id,
            "generation": self.generation,
            "low_water_mark": self.low_water_mark,
            "high_water_mark": hwm,
            "writable": self._running,
            "pending_appends": self._num_pending,
            "replicas": replicas,
        }


def _connection_of(replica: ReplicaSession) -> ReplicaConnection:
    connection = replica.connection
    if connection is None:
        raise StorageRpcError(f"{replica.replica_id} is not connected")
    return connection
