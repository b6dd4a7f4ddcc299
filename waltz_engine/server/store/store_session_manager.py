"""The store sessions of one partition, one after another (``StoreSessionManager``).

A new session id is the stored one + 1, written with CAS on ``store/partition/<id>``; the stored
generation must not be newer than ours (a newer owner fences us off). Opening the session runs
recovery; then the previous session's undecided appends are resolved against the new session's
resolved high-water mark, before any new append is accepted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kazoo.client import KazooClient

from waltz_engine.common.backoff import Backoff
from waltz_engine.server.store.config import (
    METADATA_INITIAL_RETRY_INTERVAL_MS,
    METADATA_MAX_RETRY_INTERVAL_MS,
    StoreConfig,
)
from waltz_engine.server.store.errors import (
    GenerationMismatchError,
    StorePartitionClosedError,
)
from waltz_engine.server.store.metadata_calls import metadata_call
from waltz_engine.server.store.replica_connection import StorageConnections
from waltz_engine.server.store.replica_session import ReplicaSession
from waltz_engine.server.store.store_session import StoreSession
from waltz_engine.zk.payloads import PartitionMetadata, ReplicaId
from waltz_engine.zk.store_metadata import read_partition_metadata, write_partition_metadata
from waltz_engine.zk.znodes import ConcurrentUpdateError

log = logging.getLogger(__name__)

NO_GENERATION = -1


class StoreSessionManager:
    def __init__(
        self,
        partition_id: int,
        config: StoreConfig,
        zk_client: KazooClient,
        cluster_root: str,
        connections: StorageConnections,
        replica_ids: Callable[[int], list[ReplicaId]],
    ) -> None:
        self.partition_id = partition_id
        self.generation = NO_GENERATION
        self.healthy = True
        self._config = config
        self._zk = zk_client
        self._root = cluster_root
        self._connections = connections
        self._replica_ids = replica_ids
        self._current: StoreSession | None = None
        self._opening: StoreSession | None = None
        self._lock = asyncio.Lock()
        self._running = True
        self.last_high_water_mark = -1
        # Called when the current session fails: its successor is opened right away.
        self.on_session_failure: Callable[[], None] | None = None

    @property
    def current_session(self) -> StoreSession | None:
        return self._current

    def set_generation(self, generation: int) -> None:
        """Monotonic: a newer generation makes the next use open a new session.

        A session still opening for an older generation is closed (its recovery aborted): it
        could never serve, and it holds the lock the newer generation's session opens under. Its
        recovery may wait for good on replicas a newer owner's session fenced meanwhile (issue
        32, the simulator's seed 7 once moves waited for the replicas of record: the partition,
        assigned back to this server, never opened again)."""
        self.generation = max(self.generation, generation)
        opening = self._opening
        if opening is not None and opening.generation < self.generation:
            log.info(
                "partition %d: generation %d: closing session %d, still opening for generation %d",
                self.partition_id,
                self.generation,
                opening.session_id,
                opening.generation,
            )
            opening.close()

    def close_current_session(self) -> bool:
        """Close the open session (its undecided appends go to the next one); True if there was one."""
        session = self._current
        if session is None or not session.writable:
            return False
        session.close()
        return True

    def serving_session(self, generation: int) -> StoreSession | None:
        """The session :meth:`get_store_session` would return without waiting, else None."""
        session = self._current
        if (
            self._running
            and session is not None
            and session.writable
            and session.generation == self.generation == generation
            and not self._lock.locked()
        ):
            return session
        return None

    async def get_store_session(self, generation: int | None = None) -> StoreSession:
        session = self._current
        if (
            self._running
            and session is not None
            and session.writable
            and session.generation == self.generation
            and (generation is None or generation == self.generation)
            and not self._lock.locked()
        ):
            # Every append asks: while no session is being opened and the current one serves,
            # taking the lock would return this very session, at the cost of a lock per append.
            return session
        async with self._lock:
            if generation is not None and generation != self.generation:
                raise GenerationMismatchError(
                    f"partition {self.partition_id}: generation {generation} != current {self.generation}"
                )
            while self._running:
                session = self._current
                if session is not None and session.generation == self.generation and session.writable:
                    return session
                await self._create_session(self.generation)
            self.healthy = False
            raise StorePartitionClosedError(f"partition {self.partition_id} is closed")

    async def _create_session(self, generation: int) -> None:
        previous = self._current
        if previous is not None:
            previous.close()
            if previous.failed:
                self.healthy = False
        session: StoreSession | None = None
        try:
            session_id = await self._next_session_id(generation)
            replica_ids = self._replica_ids(self.partition_id)
            replica_sessions = [
                ReplicaSession(replica_id, session_id, self._connections, self._config, i / len(replica_ids))
                for i, replica_id in enumerate(replica_ids)
            ]
            session = StoreSession(
                self.partition_id,
                generation,
                session_id,
                self._config,
                replica_sessions,
                self._zk,
                self._root,
            )
            self._opening = session
            await session.open()
            if previous is not None:
                await previous.wait_closed()
                await previous.resolve_by(session)
        except BaseException:
            self.healthy = False
            if session is not None:
                session.close()
            raise
        finally:
            self._opening = None
        self.healthy = True
        if self._running:
            session.on_failure = self._session_failed
            self._current = session
            self.last_high_water_mark = session.high_water_mark
            if set(self._replica_ids(self.partition_id)) != set(replica_ids):
                # The assignment changed while it opened (``close_current_session`` found no
                # open session to close): a replica added then would be left out of every
                # session until the next change. Its successor opens with the new replicas.
                log.info(
                    "partition %d: the replicas changed while session %d opened",
                    self.partition_id,
                    session_id,
                )
                session.close()
        else:
            session.close()

    def _session_failed(self, session: StoreSession) -> None:
        # Always, not only when appends wait: an idle partition whose session failed (a storage
        # node blinked) would otherwise report unhealthy until its next append.
        if self.on_session_failure is not None:
            self.on_session_failure()

    async def _next_session_id(self, generation: int) -> int:
        """CAS ``sessionId + 1`` (and our generation) into the partition metadata."""
        backoff = Backoff(METADATA_INITIAL_RETRY_INTERVAL_MS, METADATA_MAX_RETRY_INTERVAL_MS)
        while True:
            what = f"partition {self.partition_id}: new session"
            old, version = await metadata_call(
                what, read_partition_metadata, self._zk, self._root, self.partition_id
            )
            if old.generation > generation:
                raise GenerationMismatchError(
                    f"partition {self.partition_id}: generation {old.generation} in ZooKeeper is newer "
                    f"than ours ({generation})"
                )
            new = PartitionMetadata.of_map(generation, old.session_id + 1, old.states_map())
            try:
                await metadata_call(
                    what, write_partition_metadata, self._zk, self._root, self.partition_id, new, version
                )
                return new.session_id
            except ConcurrentUpdateError:
                await backoff.wait()

    async def close(self, error: BaseException) -> None:
        self._running = False
        self.healthy = False
        if self._opening is not None:
            self._opening.close()  # aborts its recovery
        session, self._current = self._current, None
        if session is not None:
            session.close()
            await session.wait_closed()
            session.fail_all(error)
