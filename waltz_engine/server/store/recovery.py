"""Recovery of a new store session (``RecoveryManagerImpl``; design "Recovery Procedure").

Every replica session, once connected, classifies its replica from the ZK ``ReplicaState`` and
the storage's ``LastSessionInfo`` (voting / clean but behind), then takes part in resolving the
closing high-water mark of the previous session by voting over the *previous* replica set.
While absent replicas could still change the answer the decision waits; lagging replicas copy
records from an "usher" meanwhile. Once resolved each replica truncates its dirty tail, sets the
session's low-water mark and finishes catching up; when a quorum is done the replica states
are written back to ZK with CAS.

All replica sessions run on one event loop, so the shared state needs no lock; waiters are woken
only when something they depend on actually changed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from typing import NamedTuple

from kazoo.client import KazooClient

from waltz_engine.server.store.config import RECOVERY_BATCH_SIZE
from waltz_engine.server.store.errors import RecoveryFailedError
from waltz_engine.server.store.metadata_calls import metadata_call
from waltz_engine.server.store.replica_connection import ReplicaConnection
from waltz_engine.server.store.retained_start import restart_at_retained_start, retained_start_error
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.segment import CORRUPT_RECORD_MESSAGE
from waltz_engine.zk.java_io import JavaHashMap
from waltz_engine.zk.payloads import (
    UNRESOLVED_HIGH_WATER_MARK,
    PartitionMetadata,
    ReplicaId,
    ReplicaState,
)
from waltz_engine.zk.store_metadata import read_partition_metadata, write_partition_metadata
from waltz_engine.zk.znodes import NO_VERSION, ConcurrentUpdateError

log = logging.getLogger(__name__)

NO_DUMMY_SESSION_ID = -1  # the session id a replica new to the partition gets in ZK
UNKNOWN_HIGH_WATER_MARK = -1  # resolved high-water mark when the previous session had no replicas


class _ReplicaRecoveryState(NamedTuple):
    replica_id: ReplicaId
    connection: ReplicaConnection
    high_water_mark: int
    is_new: bool
    # Its records up to here are committed ones (its low-water mark when the recovery began).
    low_water_mark: int
    # Its report says nothing of the records above ``high_water_mark`` (see ``_evaluate``).
    blind_above: bool = False


async def _truncate(connection: ReplicaConnection, replica_id: ReplicaId, transaction_id: int) -> int:
    """Cut the replica's dirty tail above ``transaction_id``; the max txid it keeps.

    A replica whose log begins above ``transaction_id + 1`` keeps nothing: it was filled from
    the others' retained start (``restart_at_retained_start``) after its control file last took
    a low-water mark, and the session that filled it ended before setting a new one. The node
    refuses that truncate (it would leave a gap), and every store session failed on it, for good
    (issue 32: the simulator's seed 236, a full disk between the emptying and the fill). All it
    holds is above the mark, the tail the truncate would cut: it is emptied, to be filled again
    from the retained start.
    """
    try:
        return await connection.truncate(transaction_id)
    except StorageRpcError as e:
        retained = retained_start_error(e)
        if retained is None or retained.retained_start <= transaction_id + 1:
            raise
        log.warning(
            "%s: its log begins at %d, above its mark %d: emptying it",
            replica_id,
            retained.retained_start,
            transaction_id,
        )
        return await connection.truncate(-1)


class RecoveryManager:
    def __init__(
        self,
        zk_client: KazooClient,
        cluster_root: str,
        partition_id: int,
        generation: int,
        session_id: int,
        quorum: int,
        replica_ids: list[ReplicaId],
    ) -> None:
        assert quorum >= 1
        self.partition_id = partition_id
        self.generation = generation
        self.session_id = session_id
        self.quorum = quorum
        self._zk = zk_client
        self._root = cluster_root
        self._replica_ids = list(replica_ids)
        self._metadata = PartitionMetadata.empty()
        self._metadata_version = NO_VERSION
        self._states: dict[ReplicaId, _ReplicaRecoveryState] = {}
        # Ended: caught up to the resolved mark, its low-water mark set (its disk took this
        # session). Only these are recorded clean in this session (``_new_replica_states``).
        self._recovered: set[ReplicaId] = set()
        self._left: set[ReplicaId] = set()  # failed during this recovery: finishes without them
        # Not voting for a disk session older than ZooKeeper's: blind above their mark (``_evaluate``).
        self._blind: set[ReplicaId] = set()
        self._min_voting_high_water_mark: int | None = None
        self.resolved_high_water_mark: int | None = None
        self._aborted: RecoveryFailedError | None = None
        self._started = asyncio.Event()
        self._completed = asyncio.Event()
        self._changed = asyncio.Event()
        self._update_lock = asyncio.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the partition metadata this session wrote; replica recoveries wait for it."""
        try:
            await self._load_metadata()
        except BaseException as e:
            self.abort(e)
            raise
        finally:
            self._started.set()

    def abort(self, cause: BaseException) -> None:
        if self._aborted is None:
            log.warning(
                "partition %d session %d: recovery aborted: %s", self.partition_id, self.session_id, cause
            )
            self._aborted = (
                cause
                if isinstance(cause, RecoveryFailedError)
                else RecoveryFailedError(f"recovery aborted: {cause}")
            )
            self._notify()
            self._completed.set()

    @property
    def aborted(self) -> bool:
        return self._aborted is not None

    def _check_abort(self) -> None:
        if self._aborted is not None:
            raise self._aborted

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    async def high_water_mark(self) -> int:
        """The resolved high-water mark, once a quorum of replicas has recovered and ZK is updated."""
        await self._completed.wait()
        self._check_abort()
        if self.resolved_high_water_mark is None:
            raise RecoveryFailedError("completed normally, but high-water mark is not resolved")
        return self.resolved_high_water_mark

    # --- one replica ----------------------------------------------------------------------------

    async def recover(self, replica_id: ReplicaId, connection: ReplicaConnection) -> int:
        """Classify, vote, truncate and catch up one replica; returns the resolved high-water mark."""
        await self._started.wait()
        self._check_abort()
        try:
            state = self._metadata_states().get(replica_id)
            is_new = False
            if state is None:
                if not self._metadata.replica_states:
                    state = ReplicaState(replica_id, NO_DUMMY_SESSION_ID, UNRESOLVED_HIGH_WATER_MARK)
                else:
                    is_new = True
                    state = ReplicaState(replica_id, NO_DUMMY_SESSION_ID, UNKNOWN_HIGH_WATER_MARK)
            info = await connection.last_session_info()
            if info.session_id < state.session_id or is_new:
                # A disk restored from an old copy (its session is older than ZK says), or a replica
                # new to the partition: only records up to its own low-water mark are known clean.
                if not is_new:
                    log.warning(
                        "%s: storage session %d < ZK %d, not voting",
                        replica_id,
                        info.session_id,
                        state.session_id,
                    )
                max_transaction_id = await _truncate(connection, replica_id, info.low_water_mark)
                voting = False
                self._blind.add(replica_id)
            elif not state.is_unresolved:
                # The closing high-water mark of its last session is known: anything above is dirty.
                # Not below the mark of a later session on its disk, which ZooKeeper does not record
                # for it (that session's recovery set the mark, then failed to record the replica;
                # or left it out and it caught up afterwards): what it holds to that mark is
                # committed. The cut removed committed records, or was refused where the replica's
                # head was in the tier, in every session, for good (issue 32: the simulator's bank
                # seed 211, seeds 313, 399, 30447 and 40057).
                mark = state.closing_high_water_mark
                if info.session_id > state.session_id:
                    mark = max(mark, info.low_water_mark)
                max_transaction_id = await _truncate(connection, replica_id, mark)
                voting = False
            else:
                max_transaction_id = await connection.max_transaction_id()
                # Below its session's low-water mark the replica is clean but too far behind to vote.
                voting = max_transaction_id >= info.low_water_mark
            await self._resolve(replica_id, connection, voting, max_transaction_id, info.low_water_mark)
            assert self.resolved_high_water_mark is not None
            return self.resolved_high_water_mark
        except (asyncio.CancelledError, GeneratorExit):
            raise  # (GeneratorExit: the coroutine is being closed, see StoreSession.open)
        except BaseException as e:
            # This replica only: its replica session closes and leaves the recovery (``leave``),
            # which goes on while a quorum of replicas can still finish it.
            if isinstance(e, RecoveryFailedError):
                raise
            raise RecoveryFailedError(f"failed to recover {replica_id}: {e}") from e

    def leave(self, replica_id: ReplicaId, cause: BaseException) -> None:
        """``replica_id`` failed (a refused request, a lost connection): it is left out of this
        recovery, which finishes without it while a quorum of replicas remains (its ZK state then
        keeps its old session and gets the resolved closing mark, so the next session truncates
        and catches it up). The original aborts the whole recovery, so that one replica refusing
        the new session, a session id forged on it say, made the partition unwritable."""
        if self._aborted is not None or replica_id in self._left or replica_id in self._recovered:
            return
        self._left.add(replica_id)
        remaining = len(self._replica_ids) - len(self._left)
        if remaining < self.quorum:
            self.abort(
                RecoveryFailedError(
                    f"{replica_id} failed and {remaining} replicas remain, fewer than a quorum of "
                    f"{self.quorum}: {cause}"
                )
            )
            return
        log.warning(
            "partition %d session %d: %s left out of this recovery (%d replicas remain): %s",
            self.partition_id,
            self.session_id,
            replica_id,
            remaining,
            cause,
        )
        self._notify()

    async def end(self, replica_id: ReplicaId) -> None:
        """This replica is clean and caught up; the quorum-th one writes the replica states to ZK."""
        self._recovered.add(replica_id)
        if len(self._recovered) >= self.quorum:
            try:
                await self._update_replica_states()
            except BaseException as e:
                self.abort(e)
                raise
            self._completed.set()
        else:
            await self._completed.wait()
        self._check_abort()

    async def _resolve(
        self,
        replica_id: ReplicaId,
        connection: ReplicaConnection,
        voting: bool,
        high_water_mark: int,
        low_water_mark: int,
    ) -> None:
        # A replica that does not vote holds no dirty record, but is recorded clean in this
        # session only once it ends (``_new_replica_states``), not here as in the original.
        minimum = self._min_voting_high_water_mark
        if voting and (minimum is None or high_water_mark < minimum):
            self._min_voting_high_water_mark = high_water_mark
        last_replica_ids = {state.replica_id for state in self._metadata.replica_states}
        last_quorum = len(last_replica_ids) // 2 + 1
        self._notify()
        if not last_replica_ids and self.resolved_high_water_mark is None:
            self._set_resolved(UNKNOWN_HIGH_WATER_MARK)

        state = _ReplicaRecoveryState(
            replica_id,
            connection,
            high_water_mark,
            replica_id not in last_replica_ids,
            low_water_mark,
            replica_id in self._blind,
        )
        while True:
            self._check_abort()
            resolved = self.resolved_high_water_mark
            if resolved is not None and state.high_water_mark >= resolved:
                # Deviation from the original, which sets the low-water mark as soon as the mark is
                # resolved and catches up afterwards: a real storage node refuses a local low-water
                # mark (its max txid then) below the one it already has, which a replica truncated
                # to an old closing mark can be under. Setting it once caught up (max == resolved)
                # always satisfies the node and stores the same low-water mark.
                if resolved < low_water_mark:
                    # Committed records (up to the replica's low-water mark) would be cut: only
                    # metadata gone wrong resolves that low, e.g. a cluster re-created under nodes
                    # restored from a backup without --all-replicas-lost. Refuse; nothing is lost.
                    raise RecoveryFailedError(
                        f"{replica_id}: the resolved high-water mark {resolved} is below its low-water "
                        f"mark {low_water_mark}; not cutting committed records (check the cluster's "
                        "metadata: docs/operations.md)"
                    )
                state = state._replace(high_water_mark=await connection.truncate(resolved))
                await connection.set_low_water_mark(resolved)
                break
            usher = self._evaluate(state, len(last_replica_ids), last_quorum)
            if usher is not None:
                state = state._replace(high_water_mark=await self._catch_up(state, usher, connection))
            elif self.resolved_high_water_mark is None:
                await self._wait_change()
            elif self.resolved_high_water_mark > state.high_water_mark:
                raise RecoveryFailedError(f"{replica_id}: no replica to catch up from")

    def _evaluate(
        self, state: _ReplicaRecoveryState, num_last_replicas: int, last_quorum: int
    ) -> _ReplicaRecoveryState | None:
        """Record ``state``, try to resolve the high-water mark; the replica to catch up from, if any."""
        if self._states.get(state.replica_id) != state:
            self._states[state.replica_id] = state
            self._notify()
        states = sorted(
            (s for s in self._states.values() if not s.is_new), key=lambda s: s.high_water_mark, reverse=True
        )
        # Replicas of the previous session that have not reported (removed ones count too, as the original).
        num_absent = num_last_replicas - len(states)
        # A replica of the previous session that does not vote because its disk's session is older
        # than ZooKeeper says (a node the partition was moved away from and back onto: unassigning
        # resets it) was truncated to its low-water mark: its report says nothing of the records
        # above, which it may have held committed. Above its mark it counts as absent, not as a
        # replica that never had them; else the previous session's other holder of a committed
        # record, outvoted by a lagging voter, resolved the mark below it (issue 32: the simulator's
        # seeds 1120 and 1780, a decommission's source moved back as another's target; the
        # low-water mark rail held, and every recovery failed on it, for good). Caught up from an
        # usher it supports the level it reached, as a lagging voter does. Above every reported
        # level only the absent and the blind may hold a record: while they could be a quorum,
        # nothing is decided (with every replica testifying that is never so).
        blind = sorted(s.high_water_mark for s in states if s.blind_above)
        usher: _ReplicaRecoveryState | None = None
        undecidable = num_absent + len(blind) >= last_quorum
        supports = 0
        min_voting = self._min_voting_high_water_mark
        for i, other in enumerate(states):
            if other.high_water_mark > state.high_water_mark:
                # A replica left out still supports what it reported, but cannot be copied from.
                if other.replica_id not in self._left:
                    usher = other
            elif other.high_water_mark < state.high_water_mark:
                break
            if (
                self.resolved_high_water_mark is None
                and min_voting is not None
                and min_voting <= state.high_water_mark
            ):
                supports += 1
                last_of_level = i == len(states) - 1 or other.high_water_mark > states[i + 1].high_water_mark
                if last_of_level:
                    blind_below = bisect.bisect_left(blind, other.high_water_mark)
                    if supports < last_quorum <= supports + num_absent + blind_below:
                        # Not a quorum yet, but the absent replicas could still make it one (or not).
                        undecidable = True
                    if not undecidable and supports >= last_quorum:
                        self._set_resolved(other.high_water_mark)
        return usher

    def _set_resolved(self, high_water_mark: int) -> None:
        if self.resolved_high_water_mark is None:
            log.info(
                "partition %d session %d: resolved high-water mark %d",
                self.partition_id,
                self.session_id,
                high_water_mark,
            )
            self.resolved_high_water_mark = high_water_mark
            self._notify()

    async def _catch_up(
        self, state: _ReplicaRecoveryState, usher: _ReplicaRecoveryState, connection: ReplicaConnection
    ) -> int:
        current = state.high_water_mark
        resolved = self.resolved_high_water_mark
        target = resolved if resolved is not None else usher.high_water_mark
        # Replicas that refused the stretch from current + 1 as corrupt; on rot everywhere in a
        # batch, records are asked for one at a time until one is given whole.
        refused: set[ReplicaId] = set()
        one_by_one = False
        first_usher = usher
        while current < target:
            count = 1 if one_by_one else min(target - current, RECOVERY_BATCH_SIZE)
            if usher.is_new:  # taken past rot (_other_usher): only what it holds committed
                if current >= usher.low_water_mark:
                    usher = first_usher
                    continue
                count = min(count, usher.low_water_mark - current)
            try:
                records = await usher.connection.records(current + 1, count)
            except StorageRpcError as e:
                if CORRUPT_RECORD_MESSAGE in str(e):
                    # Rot on the usher's disk: that stretch comes from another replica that holds it.
                    refused.add(usher.replica_id)
                    other = self._other_usher(state, current + 1, refused)
                    if other is not None:
                        log.warning("recovery copies from %s instead: %s", other.replica_id, e)
                        usher = other
                    elif not one_by_one:
                        one_by_one = True
                        refused.clear()
                    elif self._num_unreported() > 0:
                        # A replica not heard from yet may hold it whole: wait until one reports
                        # (aborting here made the recovery's success depend on who connects first).
                        await self._wait_change()
                        self._check_abort()
                        refused.clear()
                        one_by_one = False
                    else:
                        whole = f"no replica gives transaction {current + 1} whole"
                        raise RecoveryFailedError(f"{whole}: {e}") from None
                    continue
                retained = retained_start_error(e)
                if retained is None:
                    raise
                # Retention removed what this replica lacks: it continues at the retained start.
                current = await restart_at_retained_start(
                    connection, state.replica_id, current, retained.retained_start
                )
                continue
            if not records:
                if usher is not first_usher:
                    usher = first_usher  # the other replica ends sooner: back past the rot
                    continue
                raise RecoveryFailedError(f"{usher.replica_id} has no record {current + 1} to copy")
            await connection.append(records)
            current += len(records)
            refused.clear()
            one_by_one = False
            resolved = self.resolved_high_water_mark
            target = resolved if resolved is not None else target
        return current

    def _num_unreported(self) -> int:
        """Replicas of this session that have neither reported their state nor left."""
        return len(set(self._replica_ids) - self._left - self._states.keys())

    def _other_usher(
        self, state: _ReplicaRecoveryState, transaction_id: int, refused: set[ReplicaId]
    ) -> _ReplicaRecoveryState | None:
        """A replica to copy ``transaction_id`` from, other than those that refused it as corrupt.

        The original never copies from a replica new to the set; here one may give a record at or
        below its own low-water mark (a committed record, the same on every replica): with rot on
        the usher and the previous session's other replicas lagging or moved away, it may be the
        only one holding it whole, and without it every recovery aborted, for good (issue 32: the
        simulator's seed 274, a decommission's target).
        """
        for other in sorted(self._states.values(), key=lambda s: s.high_water_mark, reverse=True):
            if (
                other.replica_id != state.replica_id
                and other.replica_id not in refused
                and other.replica_id not in self._left
                and (not other.is_new or transaction_id <= other.low_water_mark)
                and other.high_water_mark >= transaction_id
            ):
                return other
        return None

    # --- ZooKeeper ------------------------------------------------------------------------------

    def _metadata_states(self) -> dict[ReplicaId, ReplicaState]:
        return {state.replica_id: state for state in self._metadata.replica_states}

    async def _load_metadata(self) -> None:
        try:
            metadata, version = await asyncio.to_thread(
                read_partition_metadata, self._zk, self._root, self.partition_id
            )
        except Exception as e:
            raise RecoveryFailedError(f"failed to get partition metadata: {e}") from e
        if version == NO_VERSION:
            raise RecoveryFailedError("partition metadata node missing")
        if metadata.session_id != self.session_id:
            raise RecoveryFailedError(
                f"session id mismatch: ZK has {metadata.session_id}, this session is {self.session_id}"
            )
        self._metadata = metadata
        self._metadata_version = version

    def _new_replica_states(self) -> JavaHashMap[ReplicaId, ReplicaState]:
        resolved = self.resolved_high_water_mark
        assert resolved is not None
        old_states = self._metadata_states()
        states: JavaHashMap[ReplicaId, ReplicaState] = JavaHashMap(ReplicaId.java_hash)
        for replica_id in self._replica_ids:
            old = old_states.get(replica_id)
            # Recorded clean in this session only once it holds the session's committed prefix
            # and its disk took the session (its low-water mark set): ``end``. The original
            # records a replica that does not vote as clean as soon as it reports, before it
            # caught up (its low-water mark is set before the catch-up there, after it here:
            # ``_resolve``). When that catch-up failed (a full disk), ZooKeeper had the replica
            # at this session while its disk kept an older one, and every later recovery took it
            # for a disk restored from an old copy, blind above its mark: with rot in a record on
            # another replica no recovery could decide, for good (issue 32: the simulator's seed
            # 41020). Not ended, it keeps the original's state for a replica that did not finish:
            # the next recovery cuts it to a closing mark and catches it up.
            if replica_id in self._recovered:
                new = ReplicaState(replica_id, self.session_id, UNRESOLVED_HIGH_WATER_MARK)
            elif old is None:
                new = ReplicaState(replica_id, NO_DUMMY_SESSION_ID, resolved)
            elif old.session_id < self.session_id and old.is_unresolved:
                # Active in an earlier session and not recovered yet: valid up to the resolved mark.
                new = ReplicaState(replica_id, old.session_id, resolved)
            else:
                new = old
            states.put(replica_id, new)
        return states

    async def _update_replica_states(self) -> None:
        async with self._update_lock:
            self._check_abort()
            while self._metadata.session_id == self.session_id:
                new = PartitionMetadata.of_map(self.generation, self.session_id, self._new_replica_states())
                if _same_metadata(new, self._metadata):
                    return
                try:
                    await metadata_call(
                        f"partition {self.partition_id}: recovery",
                        write_partition_metadata,
                        self._zk,
                        self._root,
                        self.partition_id,
                        new,
                        self._metadata_version,
                    )
                    await self._load_metadata()
                    return
                except ConcurrentUpdateError:
                    log.debug(
                        "partition %d: replica states changed concurrently, retrying", self.partition_id
                    )
                self._check_abort()
                # Fails when another session took over, which ends this recovery.
                await self._load_metadata()


def _same_metadata(a: PartitionMetadata, b: PartitionMetadata) -> bool:
    """Equal as the original's ``PartitionMetadata.equals`` (the replica states are a map)."""
    return (
        a.generation == b.generation
        and a.session_id == b.session_id
        and set(a.replica_states) == set(b.replica_states)
        and len(a.replica_states) == len(b.replica_states)
    )
