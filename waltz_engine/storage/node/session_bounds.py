"""ZooKeeper's bound on a partition's session ids, as a storage node enforces it.

A store session id is issued only by a server's compare-and-set of
``<root>/store/partition/<id>`` (``PartitionMetadata.sessionId``), before the server sends it
to any replica. A request carrying a higher id was forged (by any TLS client that knows the
cluster key) or comes from a cluster recreated under the node. In the original such a request
raises the node's fencing session id for good, so that every real session is refused there
and the partition can become unwritable. Here a request may move the session id only up to
what ZooKeeper has issued: the node reads the znode when a higher id than it knows arrives.

A replica's session id is only as good as its memory. Unassigning a partition resets it to -1
(as the original), and a node does not keep it across the reset: a deposed writer's appends,
held up in the network since before the replica was moved away and back, moved it to their dead
session and were written where the next session's recovery took them for committed (issue 32:
the simulator's seed 1156). So where the session id is unset but the replica is not new (reset
while the node ran, or holding records or a low-water mark no store session set: see
``PartitionWorker._fence_forgotten``), it moves only to the session ZooKeeper issued last, as
read after the request arrived; an older one is refused as the original refuses a session older
than the stored one (``ConcurrentUpdateException``). The first session to reach such a replica
is one recovering it now, hence the latest; a superseded session's writes are needed nowhere
(its successor's recovery decides the log from the replicas it reaches itself).

Reads of the znode are bounded: one in flight per partition (concurrent checks share it) and
at most one per ``ISSUED_READ_INTERVAL_MS``, however many forged ids arrive.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.common import clock
from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.storage.control_file import ConcurrentUpdateError
from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperSettings, describe, new_client
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import PartitionMetadata

if TYPE_CHECKING:
    from kazoo.client import KazooClient

# A flood of forged ids costs ZooKeeper at most one read per partition per interval.
ISSUED_READ_INTERVAL_MS = 50
# One ZooKeeper call (sync, then get) waits at most this long; the request then fails and the
# sender (a server's recovery) retries it.
ZOOKEEPER_CALL_TIMEOUT_MS = 5_000
NO_SESSION = -1


class UnissuedSessionError(StorageError):
    """A request's session id is above every id ZooKeeper has issued for its partition."""


class SupersededSessionError(ConcurrentUpdateError):
    """A request would set a replica's forgotten session id to an id below the one ZooKeeper
    issued last for its partition: its writer was deposed."""


class SessionBounds:
    """The highest store session id ZooKeeper has issued, per partition, as last read."""

    def __init__(self, settings: ZooKeeperSettings, connector: ZooKeeperConnector = new_client) -> None:
        self._settings = settings
        self._connector = connector
        self._paths = ClusterPaths.of(settings.cluster_root)
        self._client: KazooClient | None = None
        self._issued: dict[int, int] = {}
        self._reads: dict[int, asyncio.Task[tuple[int, int]]] = {}
        self._last_read_ns: dict[int, int] = {}

    def start(self) -> None:
        """Connect in the background: a check before the connection is up waits for it (bounded)."""
        assert self._client is None
        self._client = self._connector(self._settings)
        self._client.start_async()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.stop()
            client.close()

    def issued(self, partition_id: int) -> int:
        return self._issued.get(partition_id, NO_SESSION)

    async def check(self, partition_id: int, session_id: int, *, latest_only: bool = False) -> None:
        """Return if ZooKeeper has issued ``session_id`` for the partition; raise otherwise.
        ``latest_only`` (the replica's session id was forgotten): only the session ZooKeeper
        issued last, as read after this call began, is accepted.

        A check joins the read in flight; if that read began before this request arrived, it may
        predate the server's compare-and-set, so a "no" from it is asked once more (as is a
        "yes" for ``latest_only``: a later session may have been issued since).
        """
        known = self.issued(partition_id)
        if latest_only and session_id < known:
            raise _superseded(partition_id, session_id, known)
        if session_id <= known and not latest_only:
            return
        arrived_ns = clock.monotonic_ns()
        while True:
            read = self._reads.get(partition_id)
            if read is None:
                read = asyncio.create_task(self._read(partition_id), name=f"session-bound-{partition_id}")
                self._reads[partition_id] = read
                read.add_done_callback(lambda _: self._reads.pop(partition_id, None))
            issued, started_ns = await asyncio.shield(read)
            if latest_only and session_id < issued:
                raise _superseded(partition_id, session_id, issued)
            if session_id <= issued and not (latest_only and started_ns < arrived_ns):
                return
            if started_ns >= arrived_ns:
                raise UnissuedSessionError(
                    f"session id {session_id} of partition {partition_id} was never issued (ZooKeeper's "
                    f"store session is {issued}): refused, the node's session id stays as it is"
                )

    async def _read(self, partition_id: int) -> tuple[int, int]:
        """(the bound, when the ZooKeeper read began)."""
        last_ns = self._last_read_ns.get(partition_id)
        if last_ns is not None:
            wait_ms = ISSUED_READ_INTERVAL_MS - (clock.monotonic_ns() - last_ns) / 1e6
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
        started_ns = clock.monotonic_ns()
        try:
            issued = await asyncio.to_thread(self._read_znode, partition_id)
        finally:
            self._last_read_ns[partition_id] = clock.monotonic_ns()
        # Ids are issued in increasing order; never lower a bound already seen.
        issued = max(issued, self.issued(partition_id))
        self._issued[partition_id] = issued
        return issued, started_ns

    def _read_znode(self, partition_id: int) -> int:
        client = self._client
        path = self._paths.partition(partition_id)
        timeout_s = ZOOKEEPER_CALL_TIMEOUT_MS / 1000
        try:
            if client is None:
                raise StorageError("no ZooKeeper connection")
            # The server's compare-and-set may have gone through another ensemble member.
            client.sync_async(path).get(timeout=timeout_s)
            data, _ = client.get_async(path).get(timeout=timeout_s)
        except NoNodeError:
            return NO_SESSION
        except (KazooException, StorageError) as e:
            detail = describe(e) if isinstance(e, KazooException) else str(e)
            raise StorageError(
                f"cannot confirm a new session id of partition {partition_id} with ZooKeeper ({detail}); "
                "retry once ZooKeeper answers"
            ) from None
        except KazooTimeoutError:
            raise StorageError(
                f"cannot confirm a new session id of partition {partition_id} with ZooKeeper "
                f"(no answer within {ZOOKEEPER_CALL_TIMEOUT_MS} ms); retry once ZooKeeper answers"
            ) from None
        if not data:
            return NO_SESSION
        try:
            return PartitionMetadata.from_bytes(data).session_id
        except WaltzError as e:
            raise StorageError(f"znode {path} cannot be read ({e}): no new session id is accepted") from None


def _superseded(partition_id: int, session_id: int, issued: int) -> SupersededSessionError:
    return SupersededSessionError(
        f"session id {session_id} of partition {partition_id} was superseded (ZooKeeper's store session "
        f"is {issued}): its writer was deposed; refused, the replica's session id stays as it is"
    )
