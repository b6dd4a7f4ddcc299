"""One replica (a partition on one storage node) within one store session (``ReplicaSession``).

Its task connects with backoff, recovers the replica, then follows the store session: a batch
that starts exactly at the replica's next transaction id is written and voted on; a replica
behind the batch catches up from committed records (no vote). Any failure closes the replica
session: its current and future votes become abstentions, which makes the store session roll.

Between batches the replica session also tells its replica the committed prefix (the original
does it only when a session starts, every ``storage.checkpointInterval`` transactions): at most
every ``storage.lowWaterMark.intervalMs``, once the replica holds committed records it was not
told of, SET_LOW_WATER_MARK in the same session with the replica's own max txid. A node (the
original's too) refuses that while its max txid is above the mark, so it goes only where the
replica holds nothing undecided: right before it writes a batch (everything below a batch handed
over is committed) or while it idles after a decided one. It moves the node's local low-water
mark, the committed bound below which its retention cleaner and its tier act. A replica with
nothing new is sent nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import NamedTuple, Protocol

from waltz_engine.common import clock
from waltz_engine.common.backoff import Backoff
from waltz_engine.common.limited_log import LimitedLog
from waltz_engine.common.record import Record
from waltz_engine.common.tasks import wait_ended
from waltz_engine.server.store.config import CATCH_UP_BATCH_SIZE, StoreConfig
from waltz_engine.server.store.errors import RecoveryFailedError, RetainedStartError, StoreError
from waltz_engine.server.store.latency_router import LatencyWeightedRoute
from waltz_engine.server.store.recovery import RecoveryManager
from waltz_engine.server.store.replica_connection import ReplicaConnection, StorageConnections
from waltz_engine.server.store.retained_start import restart_at_retained_start
from waltz_engine.server.store.voting import Voting
from waltz_engine.storage.eager_calls import AppendCall
from waltz_engine.storage.node.failures import JAVA_CONCURRENT_UPDATE_EXCEPTION
from waltz_engine.zk.payloads import ReplicaId


class CommittedBatches(Protocol):
    """What a replica session reads from its store session (``StoreSession``) to catch up: a
    protocol, so that the two modules do not import each other."""

    def next_encoded_batch(self, transaction_id: int) -> int | None: ...

    def committed_encoded_batch(self, transaction_id: int) -> tuple[bytes, int] | None: ...

    async def committed_records(
        self, transaction_id: int, max_records: int, exclude: ReplicaSession | None = None
    ) -> list[Record]: ...

    def replica_failed(self, replica: ReplicaSession) -> None: ...

    @property
    def high_water_mark(self) -> int:
        """The highest txid committed (a quorum has it durably)."""
        ...


log = logging.getLogger(__name__)
# How soon a mark due while a direct batch is unanswered is tried again.
MARK_RETRY_MS = 100
# Batches written from the store session's call and not answered yet, at most, per replica: a
# replica slower than the quorum (the third of three on a busy machine) is sent the next batch
# behind the one it still writes, in order on its connection, instead of missing it and catching
# up through its task (a task turn and a future per batch). Past it the next batch waits, as
# before, for an answer's read callback, or is caught up with.
MAX_DIRECT_IN_FLIGHT = 8
_connect_failures = LimitedLog(log)

NO_TRANSACTION_ID = -1

# Replica states shown by `status()`.
STATE_CONNECTING = "connecting"
STATE_RECOVERING = "recovering"
STATE_VOTING = "voting"
STATE_CATCHING_UP = "catching-up"
STATE_CLOSED = "closed"


class ReplicatedBatch(NamedTuple):
    """A store session's batch as every replica session of it holds it: made once per batch."""

    first_transaction_id: int
    encoded: bytes
    num_records: int
    voting: Voting
    formed_s: float  # clock.monotonic_s() as the store session formed it (its call is now)


class _DirectAppend(AppendCall):
    """A batch written from the store session's call: its answer, in the answer's read
    callback, goes straight to the replica session (no future, no closure)."""

    __slots__ = ("_replica", "_batch", "_connection")

    def __init__(
        self, replica: ReplicaSession, batch: ReplicatedBatch, connection: ReplicaConnection
    ) -> None:
        self._done = False
        self._replica = replica
        self._batch = batch
        self._connection = connection

    def on_success(self) -> None:
        self._replica._direct_answered(self._connection, self._batch, None)

    def on_failure(self, error: BaseException) -> None:
        self._replica._direct_answered(self._connection, self._batch, error)


class ReplicaSession(LatencyWeightedRoute):
    def __init__(
        self,
        replica_id: ReplicaId,
        session_id: int,
        connections: StorageConnections,
        config: StoreConfig,
        mark_phase: float = 0.0,
    ) -> None:
        super().__init__()
        assert 0.0 <= mark_phase < 1.0, mark_phase
        self.replica_id = replica_id
        self.session_id = session_id
        self.state = STATE_CONNECTING
        self._connections = connections
        self._backoff = Backoff(config.initial_retry_interval_ms, config.max_retry_interval_ms)
        self._connection: ReplicaConnection | None = None
        self._connect_finished = False  # connected, or gave up: the replica counts as a voter
        self._closed = False
        self._left_recovery = False
        self._next_transaction_id = NO_TRANSACTION_ID  # the writer's; valid once recovered
        self._batch_transaction_id = NO_TRANSACTION_ID  # first txid of the latest batch handed over
        self._batch: ReplicatedBatch | None = None
        # The batches sent from the store session's call itself (no task turn), in txid order,
        # until answered (a connection's answers come in the order of its requests).
        self._direct: deque[ReplicatedBatch] = deque()
        # The task waits for the next batch, caught up: a batch may then go from the store
        # session's call (``append``); untimed: with no mark due later, so a direct batch's answer
        # wakes it to time the mark of what it wrote.
        self._parked = False
        self._parked_untimed = False
        self._wakeup = asyncio.Event()
        self._recovery: RecoveryManager | None = None
        self._store_session: CommittedBatches | None = None
        self._task: asyncio.Task[None] | None = None
        self.recovered = asyncio.Event()
        # The committed prefix this replica was last told (SET_LOW_WATER_MARK), and when it may be
        # told again; 0 s: only a new session tells it. The replicas of a session are told at
        # staggered times (``mark_phase``, a fraction of the interval, earlier for each replica),
        # so that the batch that waits for a mark waits on one replica only, not on a quorum.
        self._mark_interval_s = config.low_water_mark_interval_ms / 1000
        self._mark_phase_s = mark_phase * self._mark_interval_s
        self.marked = NO_TRANSACTION_ID
        self._mark_due_s = 0.0
        self.marks_sent = 0

    @property
    def storage(self) -> str:
        return self.replica_id.storage

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_voter(self) -> bool:
        """Counted in a batch's voting: connected once (a closed one abstains), unless it was left
        out of the recovery."""
        return self._connect_finished and not self._left_recovery

    @property
    def connection(self) -> ReplicaConnection | None:
        return self._connection

    @property
    def next_transaction_id(self) -> int:
        return self._next_transaction_id

    def open(self, recovery: RecoveryManager, store_session: CommittedBatches) -> None:
        assert self._task is None, "a replica session opens once"
        self._recovery = recovery
        self._store_session = store_session
        self._task = asyncio.create_task(
            self._run(),
            name=f"ReplicaSession-{self.replica_id.partition_id}-{self.session_id}-{self.storage}",
        )

    def close(self, cause: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._connect_finished = True
        self.state = STATE_CLOSED
        recovery, self._recovery = self._recovery, None
        if recovery is not None and not self.recovered.is_set():
            if cause is not None and JAVA_CONCURRENT_UPDATE_EXCEPTION in str(cause):
                # The node fences this session out (a higher session id reached it: a forged one,
                # say): left out of the recovery, which goes on while a quorum remains, and of the
                # votes (counted as a voter it would abstain on every batch, rolling the session).
                self._left_recovery = True
                recovery.leave(self.replica_id, cause)
            else:
                # Anything else (a lost connection, a closing store) aborts the recovery, as in the
                # original: the next session starts over with every replica that is back by then.
                recovery.abort(
                    RecoveryFailedError(
                        f"replica session closed: {self.replica_id} session {self.session_id}"
                        + (f": {cause}" if cause is not None else "")
                    )
                )
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.voting.abstain()
        direct, self._direct = self._direct, deque()
        for sent in direct:
            sent.voting.abstain()
        self._wakeup.set()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def wait_closed(self) -> None:
        task = self._task
        if task is not None and task is not asyncio.current_task():
            await wait_ended(task)

    def append(self, batch: ReplicatedBatch) -> None:
        """Hand over the store session's next batch (the previous one, if never taken, abstains)."""
        if self._closed:
            if not self._left_recovery:  # one left out of the recovery is no voter
                batch.voting.abstain()
            return
        if self._batch is not None:
            self._batch.voting.abstain()
        first_transaction_id = batch.first_transaction_id
        self._batch_transaction_id = first_transaction_id
        connection = self._connection
        # (Every replica of every batch comes here: `_next_direct_transaction_id` and
        # `_can_send_now` inline, its mark check at the batch's clock read, made once for all
        # replicas as the batch was formed, in this very call.)
        direct = self._direct
        if direct:
            last = direct[-1]
            next_direct = last.first_transaction_id + last.num_records
        else:
            next_direct = self._next_transaction_id
        if (
            self._parked
            and connection is not None
            and first_transaction_id == next_direct
            and len(direct) < MAX_DIRECT_IN_FLIGHT
            and (
                self._mark_interval_s <= 0
                or self._next_transaction_id - 1 <= self.marked
                or batch.formed_s < self._mark_due_s
            )
            and connection.can_send_now()
        ):
            # (Behind the batches still unanswered, if any: the slowest of a quorum, say.)
            self._send_now(connection, batch)
            return
        self._batch = batch
        if self._parked and direct and first_transaction_id == next_direct:
            # It follows what the replica still writes, and cannot go now (a mark is due, the
            # connection is full, or too many are unanswered): an answer's read callback sends
            # it or wakes the task. Waking it now would only see the answers due and wait again.
            return
        self._wakeup.set()

    def _next_direct_transaction_id(self) -> int:
        """Where the next batch written from a call must start: after the unanswered ones."""
        direct = self._direct
        if not direct:
            return self._next_transaction_id
        last = direct[-1]
        return last.first_transaction_id + last.num_records

    def _can_send_now(self, connection: ReplicaConnection) -> bool:
        """A batch that starts at the replica's next txid (after the unanswered ones) may go from
        the caller's call, with the task parked (not writing): the replica session is open, no mark is due
        (the task path tells the replica its mark before the batch) and the connection takes it."""
        return not self._closed and not self._mark_due() and connection.can_send_now()

    def _send_now(self, connection: ReplicaConnection, batch: ReplicatedBatch) -> None:
        """Write the batch from the caller's turn; its answer votes from the read callback
        (:meth:`_direct_answered`). The task stays idle meanwhile, and waits for the answers before
        it takes another batch."""
        self._direct.append(batch)
        try:
            call = _DirectAppend(self, batch, connection)
            connection.send_append_call(batch.encoded, batch.num_records, call)
        except Exception as e:
            self._direct.pop()
            batch.voting.abstain()
            self._fail(e)

    def _direct_answered(
        self, connection: ReplicaConnection, batch: ReplicatedBatch, error: BaseException | None
    ) -> None:
        direct = self._direct
        if not direct or direct[0] is not batch:
            if batch in direct:
                # Answered before a batch sent ahead of it: never seen from a node (a connection's
                # answers follow its requests). The replica's log is not known: it ends.
                self._fail(
                    StoreError(f"{self.replica_id}: batch {batch.first_transaction_id} answered out of order")
                )
            return  # closed meanwhile: it abstained then
        direct.popleft()
        if error is not None:
            batch.voting.abstain()  # we do not know whether it was written
            self._fail(error)
            return
        self._next_transaction_id += batch.num_records
        batch.voting.vote()
        follow = self._batch
        if (
            follow is not None
            and self._parked
            and follow.first_transaction_id == self._next_direct_transaction_id()
            and len(direct) < MAX_DIRECT_IN_FLIGHT
            and self._can_send_now(connection)
        ):
            # The batch handed over meanwhile goes from this read callback too.
            self._batch = None
            self._send_now(connection, follow)
            return
        if (
            self._batch is not None
            or not self._parked
            or (self._parked_untimed and self._mark_interval_s > 0)
        ):
            # A batch came meanwhile, or the task waits for this answer: it goes on now; or
            # it must time the mark of what this batch wrote (once per mark: it parks with
            # the timer after).
            self._wakeup.set()

    def _fail(self, error: BaseException) -> None:
        """As the task does when a call fails: the replica session ends."""
        if self._closed:
            return
        log.warning("closing replica session %s (session %d): %s", self.replica_id, self.session_id, error)
        self.close(error)
        if self._store_session is not None and not self._left_recovery:
            self._store_session.replica_failed(self)

    async def _run(self) -> None:
        try:
            connection = await self._connect()
            recovery = self._recovery
            if recovery is None:
                return
            self.state = STATE_RECOVERING
            self._next_transaction_id = await recovery.recover(self.replica_id, connection) + 1
            # The recovery set the replica's low-water mark to the resolved mark, its max txid.
            self._marked_now(self._next_transaction_id - 1)
            self._mark_due_s -= self._mark_phase_s
            await recovery.end(self.replica_id)
            self._recovery = None
            self.recovered.set()
            self.state = STATE_VOTING
            while not self._closed:
                if not await self._try_current_batch(connection):
                    await self._catch_up(connection)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._fail(e)
        finally:
            self.close()

    async def _connect(self) -> ReplicaConnection:
        while True:
            try:
                client = await self._connections.get(self.storage)
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # The first failure is named at once (a node refusing the cluster key stays silent
                # otherwise); then once per interval per node, whichever partition retries.
                _connect_failures.warn(self.storage, f"cannot connect to {self.storage}, retrying: {e}")
            await self._backoff.wait()
        self._connection = ReplicaConnection(client, self.replica_id.partition_id, self.session_id)
        self._connect_finished = True
        return self._connection

    async def _try_current_batch(self, connection: ReplicaConnection) -> bool:
        """Write the current batch if it starts at our next txid; False when we are behind it."""
        if self._direct:
            # Batches sent from the store session's call are unanswered: the next waits for them.
            self._wakeup.clear()
            await self._wakeup.wait()
            return True
        batch = self._batch
        if batch is not None and batch.first_transaction_id == self._next_transaction_id:
            self._batch = None
            try:
                if self._mark_due():
                    # Every txid below a batch handed over is committed, and this replica holds up
                    # to just below it: the moment of a busy partition that a node accepts a mark.
                    await self._set_mark(connection)
                await connection.append_encoded(batch.encoded, batch.num_records)
            except BaseException:
                # We do not know whether it was written.
                batch.voting.abstain()
                raise
            self._next_transaction_id += batch.num_records
            self.state = STATE_VOTING
            batch.voting.vote()
            return True
        if self._next_transaction_id > self._batch_transaction_id:
            self._wakeup.clear()
            await self._idle(connection)
            return True
        return False

    async def _idle(self, connection: ReplicaConnection) -> None:
        """Wait for the next batch, parked; meanwhile, tell the replica the committed prefix when due."""
        while not self._wakeup.is_set() and not self._closed:
            untimed = self._next_transaction_id - 1 <= self.marked or self._mark_interval_s == 0
            wait_s = None if untimed else max(0.0, self._mark_due_s - clock.monotonic_s())
            if not await self._park(wait_s):
                return  # woken (nothing new to tell without a timer: no message)
            if self._closed:
                return
            store_session = self._store_session
            assert store_session is not None
            if self._direct:
                # A batch sent from the store session's call is unanswered: a node refuses a mark
                # below what it holds, so tell it once that is answered and decided.
                self._mark_due_s = clock.monotonic_s() + MARK_RETRY_MS / 1000
            elif self._next_transaction_id - 1 <= store_session.high_water_mark:
                await self._set_mark(connection)
            else:
                # The batch it wrote last is not decided yet (a quorum is slow or lost): later.
                self._mark_due_s = clock.monotonic_s() + self._mark_interval_s

    async def _park(self, wait_s: float | None) -> bool:
        """Wait for the wake-up (at most ``wait_s``), parked: True when the time ran out."""
        self._parked = True
        self._parked_untimed = wait_s is None
        try:
            if wait_s is None:
                await self._wakeup.wait()
                return False
            try:
                async with asyncio.timeout(wait_s):
                    await self._wakeup.wait()
            except TimeoutError:
                return True
            return False
        finally:
            self._parked = self._parked_untimed = False

    def _mark_due(self) -> bool:
        return (
            self._mark_interval_s > 0
            and self._next_transaction_id - 1 > self.marked
            and clock.monotonic_s() >= self._mark_due_s
        )

    async def _set_mark(self, connection: ReplicaConnection) -> None:
        """SET_LOW_WATER_MARK(this replica's max txid), which must be committed (a quorum holds it
        durably) and above the last mark (a node refuses a mark going back)."""
        store_session = self._store_session
        assert store_session is not None
        mark = self._next_transaction_id - 1
        assert self.marked < mark <= store_session.high_water_mark, (self.marked, mark)
        await connection.set_low_water_mark(mark)
        self.marks_sent += 1
        self._marked_now(mark)

    def _marked_now(self, mark: int) -> None:
        assert mark >= self.marked, (self.marked, mark)
        self.marked = mark
        self._mark_due_s = clock.monotonic_s() + self._mark_interval_s

    async def _catch_up(self, connection: ReplicaConnection) -> None:
        store_session = self._store_session
        assert store_session is not None
        self.state = STATE_CATCHING_UP
        missing = self._batch_transaction_id - self._next_transaction_id
        while missing > 0 and not self._closed:
            # A batch the store session still holds encoded goes as it is (no read from another
            # replica, no encoding); records are read only up to where such a batch starts.
            kept = store_session.committed_encoded_batch(self._next_transaction_id)
            if kept is not None and kept[1] <= missing:
                encoded, count = kept
                await connection.append_encoded(encoded, count)
                self._next_transaction_id += count
            else:
                chunk = min(missing, CATCH_UP_BATCH_SIZE)
                boundary = store_session.next_encoded_batch(self._next_transaction_id)
                if boundary is not None:
                    chunk = min(chunk, boundary - self._next_transaction_id)
                try:
                    records = await store_session.committed_records(
                        self._next_transaction_id, chunk, exclude=self
                    )
                except RetainedStartError as e:
                    # Retention removed what this replica lacks: it continues at the retained start.
                    self._next_transaction_id = 1 + await restart_at_retained_start(
                        connection, self.replica_id, self._next_transaction_id - 1, e.retained_start
                    )
                    missing = self._batch_transaction_id - self._next_transaction_id
                    continue
                if not records:
                    raise StoreError(f"no committed record {self._next_transaction_id} to catch up with")
                await connection.append(records)
                self._next_transaction_id += len(records)
            missing = self._batch_transaction_id - self._next_transaction_id

    def status(self) -> dict[str, object]:
        return {
            "storage": self.storage,
            "state": self.state,
            "expected_latency_ms": self.expected_latency_ms,
            "low_water_mark": self.marked,
        }
