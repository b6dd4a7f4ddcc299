"""Reading a live cluster's committed log over the network, from any machine (reference §1.3,
§2.3, §2.7): the storage nodes' admin port and the original's ``RECORD_LIST_REQUEST``, so it
reads Java 0.13.2 storage nodes as well as ours. Used by the Spark source and export; it
imports nothing of Spark.

**Where.** ZooKeeper gives the store (cluster key, partition count), each partition's replicas
(``store/assignment``) and each storage node's admin port (``store/connection``): the admin
address is the data connect string's host with that port, as the original's tools take it.

**How far.** Every partition is bounded at its committed high-water mark, asked from the
servers (HIGH_WATER_MARK_REQUEST through a client that mounts nothing), or at a bound the
caller vouches for. No record above the bound is ever returned.

**From which replica.** A replica's records are committed up to its low-water mark (admin
``LAST_SESSION_INFO``). Above it, they are the committed ones only if the replica was
recovered into a store session at least as new as the partition's current one (ZooKeeper's
``store/partition/<id>``) read *after* the bound: that recovery truncated everything a
previous session left uncommitted, and every committed txid up to the bound was committed
by that session or before it (recovery never loses a commit). So the bound is read first,
then the partition's session, then the replicas' session infos, and a replica's
``readable_to`` is the bound when its session is current, its low-water mark otherwise.

**Streaming.** A slice (a txid range of one partition) names its replicas in order of
preference; slices of a partition start on different replicas. One TLS admin connection per
slice keeps :data:`REQUESTS_IN_FLIGHT` requests of :data:`READ_BATCH_RECORDS` records in flight;
every record is checked (its txid, its data checksum). A replica that fails, answers short of
what it holds, or sends a bad record is left for the next one that holds the txids still to
read; the records already returned stay returned, so a slice's output is exact and in order.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from waltz_engine.client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_engine.client.transaction import Transaction
from waltz_engine.common.address import parse_host_port
from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import ProtocolError, WaltzError
from waltz_engine.common.record import Record
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network, tls_context
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.wire.primitives import read_records
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import read_cluster_params
from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperSettings, connect, new_client
from waltz_engine.zk.partition_ranges import not_in_cluster
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.retention import read_highest_bounds, read_retention_bounds

log = logging.getLogger(__name__)

T = TypeVar("T")

NO_TRANSACTION = -1
# Records asked per RECORD_LIST_REQUEST: large, to amortize a round trip; a node may answer
# fewer (the original stops at a segment's end), the rest is asked again.
READ_BATCH_RECORDS = 20_000
# RECORD_LIST_REQUESTs kept in flight on a slice's connection.
REQUESTS_IN_FLIGHT = 4
# A slice (one unit of work, e.g. one Spark task) holds at most this many txids.
SLICE_MAX_RECORDS = 1_000_000
CONNECT_TIMEOUT_MS = 10_000
REQUEST_TIMEOUT_MS = 60_000
# Bounds every wait on the servers of a high-water-mark query.
QUERY_TIMEOUT_MS = 15_000
# Times each replica of a slice is tried before the read fails; the pause between rounds.
ATTEMPTS_PER_REPLICA = 3
RETRY_PAUSE_MS = 500
# A storage node's gauge of where a partition's log starts after retention (ours only).
FIRST_TRANSACTION_ID_GAUGE = "first-transaction-id"


class NetworkReadError(WaltzError):
    """The cluster cannot be read as asked (no replica holds the txids, bad metadata...)."""


@dataclass(frozen=True)
class ClusterAccess:
    """Where a cluster is and how to talk to it: picklable, built from the client's config.
    ``network`` and ``zk_connector`` are the seams its connections go through (the simulator's
    in-memory ones in ``waltz sim``; the defaults everywhere else)."""

    zookeeper: ZooKeeperSettings
    tls: TlsConfig = field(default_factory=TlsConfig)
    network: Network = ASYNCIO_NETWORK
    zk_connector: ZooKeeperConnector = new_client


@dataclass(frozen=True)
class StoreAccess:
    """What a reading process needs to open admin connections (the OPEN checks key and count)."""

    key: uuid.UUID
    num_partitions: int
    tls: TlsConfig
    network: Network = ASYNCIO_NETWORK


@dataclass(frozen=True)
class ReplicaSource:
    """One storage node's copy of a partition, as seen when the read was planned."""

    storage: str  # the data connect string, as ZooKeeper names the node
    host: str
    admin_port: int
    session_id: int
    low_water_mark: int
    readable_to: int  # the highest txid this replica is trusted to hold as committed

    @property
    def admin_address(self) -> str:
        return f"{self.host}:{self.admin_port}"


@dataclass(frozen=True)
class NetworkSlice:
    """Txids ``from_txid..to_txid`` (inclusive) of one partition, and where to read them."""

    partition_id: int
    from_txid: int
    to_txid: int
    replicas: tuple[ReplicaSource, ...]  # in order of preference
    store: StoreAccess

    @property
    def count(self) -> int:
        return max(0, self.to_txid - self.from_txid + 1)


@dataclass(frozen=True)
class PartitionSources:
    partition_id: int
    committed: int  # the bound: no txid above it is read
    replicas: tuple[ReplicaSource, ...]  # the reachable ones
    store: StoreAccess
    # Where the log starts now: the latest first txid of the reachable replicas, from which every
    # one holds it (retention removes whole segments, each replica its own); 0 without retention.
    retained_start: int = 0

    @property
    def readable_to(self) -> int:
        """The last txid some replica holds as committed (at most the bound)."""
        return min(self.committed, max((r.readable_to for r in self.replicas), default=NO_TRANSACTION))

    def slices(
        self, from_txid: int, to_txid: int, max_records: int = SLICE_MAX_RECORDS
    ) -> list[NetworkSlice]:
        """``from_txid..to_txid``, cut at the bound, in slices of at most ``max_records`` txids,
        each starting on a different replica in turn among those that hold all of it."""
        assert max_records >= 1
        last = min(to_txid, self.committed)
        first = max(from_txid, 0)
        if first > last:
            return []
        if last > self.readable_to:
            held = ", ".join(f"{r.storage} to {r.readable_to}" for r in self.replicas) or "none reachable"
            raise NetworkReadError(
                f"partition {self.partition_id}: no replica holds committed transactions "
                f"{max(first, self.readable_to + 1)}..{last} yet ({held}); a recovery may be running, "
                "try again shortly"
            )
        result = []
        for index, start in enumerate(range(first, last + 1, max_records)):
            end = min(start + max_records - 1, last)
            result.append(
                NetworkSlice(self.partition_id, start, end, self._preference(end, index), self.store)
            )
        return result

    def fallback_slice(self, from_txid: int, to_txid: int) -> NetworkSlice:
        """Committed txids ``from_txid..to_txid`` as one slice, whichever replicas hold them now:
        where a reader of another copy (the tier's) goes when that copy fails it."""
        return NetworkSlice(self.partition_id, from_txid, to_txid, self._preference(to_txid, 0), self.store)

    def _preference(self, end: int, index: int) -> tuple[ReplicaSource, ...]:
        whole = [r for r in self.replicas if r.readable_to >= end]
        turn = (self.partition_id + index) % len(whole) if whole else 0
        rest = sorted((r for r in self.replicas if r.readable_to < end), key=lambda r: -r.readable_to)
        return tuple(whole[turn:] + whole[:turn] + rest)


@dataclass(frozen=True)
class ClusterLayout:
    num_partitions: int
    store: StoreAccess
    partitions: dict[int, PartitionSources]


# --- the committed bound ---------------------------------------------------------------------


class _NoFeed(WaltzClientCallbacks):
    """A client that mounts nothing: it only asks questions."""

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return NO_TRANSACTION

    def apply_transaction(self, transaction: Transaction) -> None:
        return None

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        return None


async def _high_water_marks(access: ClusterAccess, partitions: Sequence[int] | None) -> dict[int, int]:
    config = WaltzClientConfig(
        zookeeper=access.zookeeper,
        tls=access.tls,
        auto_mount=False,
        registration_timeout_ms=QUERY_TIMEOUT_MS,
        ensure_mounted_timeout_ms=QUERY_TIMEOUT_MS,
        rpc_timeout_ms=QUERY_TIMEOUT_MS,
    )
    client = await WaltzClient.create(
        _NoFeed(), config, network=access.network, zk_connector=access.zk_connector
    )
    try:
        wanted = range(client.num_partitions) if partitions is None else partitions
        marks = await asyncio.gather(
            *(client.high_water_mark(p) for p in wanted if 0 <= p < client.num_partitions)
        )
        return dict(zip([p for p in wanted if 0 <= p < client.num_partitions], marks, strict=True))
    finally:
        await client.close()


def committed_high_water_marks(
    access: ClusterAccess, partitions: Sequence[int] | None = None
) -> dict[int, int]:
    """The committed high-water mark of each partition (all of the cluster's by default)."""
    return asyncio.run(_high_water_marks(access, partitions))


# --- planning ----------------------------------------------------------------------------------


def check_partition_ids(partitions: Sequence[int], num_partitions: int) -> list[int]:
    outside = sorted(p for p in set(partitions) if not 0 <= p < num_partitions)
    if outside:
        raise NetworkReadError(not_in_cluster(outside, num_partitions))
    return sorted(set(partitions))


def partition_count(access: ClusterAccess) -> int:
    """How many partitions the cluster has."""
    with connect(access.zookeeper, access.zk_connector) as zk:
        return read_cluster_params(zk, access.zookeeper.cluster_root).num_partitions


def discover(
    access: ClusterAccess,
    partitions: Sequence[int] | None = None,
    bounds: Mapping[int, int] | None = None,
    *,
    bounds_read_before: bool = True,
) -> ClusterLayout:
    """Each wanted partition's committed bound and reachable replicas (see the module's doc for
    the order of the reads, which is what makes ``readable_to`` safe); blocking: it runs its
    own event loop.

    ``bounds_read_before=False``: the bounds were not read from the servers before this call
    (e.g. a reader's own ``to_txid``), so a replica is trusted only up to its low-water mark."""
    return asyncio.run(discover_async(access, partitions, bounds, bounds_read_before=bounds_read_before))


async def discover_from_loop(access: ClusterAccess, partitions: Sequence[int] | None = None) -> ClusterLayout:
    """:func:`discover` from a running loop: on a thread (its ZooKeeper calls block), or on the
    loop itself where the access goes through the simulator's seams (nothing there blocks, and
    the simulator runs a thread's work inline, where a second loop cannot run)."""
    if access.network is ASYNCIO_NETWORK:
        return await asyncio.to_thread(discover, access, partitions)
    return await discover_async(access, partitions)


async def discover_async(
    access: ClusterAccess,
    partitions: Sequence[int] | None = None,
    bounds: Mapping[int, int] | None = None,
    *,
    bounds_read_before: bool = True,
) -> ClusterLayout:
    """:func:`discover`'s work as a coroutine (its ZooKeeper calls block the loop it runs on)."""
    root = access.zookeeper.cluster_root
    with connect(access.zookeeper, access.zk_connector) as zk:
        num_partitions = read_cluster_params(zk, root).num_partitions
        params = store_metadata.read_store_params(zk, root)
        assignments = store_metadata.read_replica_assignments(zk, root).as_dict()
        admin_ports = store_metadata.read_connection_metadata(zk, root).as_dict()
        wanted = check_partition_ids(
            range(num_partitions) if partitions is None else partitions, num_partitions
        )
        if bounds is None:
            bounds = await _high_water_marks(access, wanted)  # first the bound...
        # ...then the partitions' current sessions (synced: a lagging ensemble member could show
        # an older session, and a replica of it would be trusted past its low-water mark)...
        sessions = {}
        for p in wanted:
            zk.sync(ClusterPaths.of(root).partition(p))
            sessions[p] = store_metadata.read_partition_metadata(zk, root, p).metadata.session_id
        # Only partitions that ever had a retention bound may start later than 0: only their
        # nodes are asked where their logs start.
        ever = set(read_retention_bounds(zk, root)) | set(read_highest_bounds(zk, root))
        retained = ever & set(wanted)
    store = StoreAccess(params.key, params.num_partitions, access.tls, access.network)
    # ...then what each replica holds.
    infos = await _session_infos(store, assignments, admin_ports, wanted, retained)
    layout = {}
    for p in wanted:
        bound = bounds.get(p, NO_TRANSACTION)
        replicas = []
        starts = [0]
        for (storage, partition_id), info in sorted(infos.items()):
            if partition_id != p:
                continue
            host, port, session_id, low_water_mark, first = info
            current = bounds_read_before and session_id >= sessions[p]
            readable = bound if current else min(bound, low_water_mark)
            replicas.append(ReplicaSource(storage, host, port, session_id, low_water_mark, readable))
            starts.append(first)
        layout[p] = PartitionSources(p, bound, tuple(replicas), store, max(starts))
    return ClusterLayout(num_partitions, store, layout)


async def _session_infos(
    store: StoreAccess,
    assignments: Mapping[str, Sequence[int]],
    admin_ports: Mapping[str, int],
    wanted: Sequence[int],
    retained: Collection[int] = (),
) -> dict[tuple[str, int], tuple[str, int, int, int, int]]:
    """(storage, partition) → (admin host, admin port, session id, low-water mark, first txid)
    of every reachable replica of the wanted partitions; an unreachable node is left out
    (logged). The first txid is asked (the node's metrics) only for the ``retained`` partitions,
    else 0; a node without the gauge (a Java node: no retention) says 0 too."""
    found: dict[tuple[str, int], tuple[str, int, int, int, int]] = {}

    async def ask(storage: str, partition_ids: list[int]) -> None:
        port = admin_ports.get(storage)
        if port is None:
            log.warning(
                "storage node %s has no admin port in ZooKeeper (store/connection): not read", storage
            )
            return
        host = parse_host_port(storage).host
        try:
            async with _admin_client(store, host, port) as admin:
                gauges = (await admin.metrics())["gauges"] if set(partition_ids) & set(retained) else {}
                for p in partition_ids:
                    info = await admin.last_session_info(p)
                    first = gauges.get(f"waltz-storage.partition-{p}.{FIRST_TRANSACTION_ID_GAUGE}", {})
                    start = first.get("value") if isinstance(first, dict) else None
                    start = start if isinstance(start, int) and not isinstance(start, bool) else 0
                    found[(storage, p)] = (host, port, info.session_id, info.low_water_mark, start)
        except (StorageRpcError, ConnectionClosedError, OSError, TimeoutError) as e:
            log.warning("storage node %s (admin %s:%d) is not read: %s", storage, host, port, e)

    await asyncio.gather(
        *(
            ask(storage, [p for p in ids if p in set(wanted)])
            for storage, ids in assignments.items()
            if any(p in set(wanted) for p in ids)
        )
    )
    return found


def _admin_client(store: StoreAccess, host: str, port: int, raw: bool = False) -> StorageAdminClient:
    return StorageAdminClient(
        host,
        port,
        tls_context(store.network, lambda: client_context(store.tls)),
        store.key,
        store.num_partitions,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        raw_records=raw,
        network=store.network,
    )


# --- reading -----------------------------------------------------------------------------------


class _ReplicaFailed(WaltzError):
    """One replica could not serve what it was trusted to hold (another is tried)."""


def _check_records(records: Sequence[Record], first: int, partition_id: int, where: str) -> None:
    for offset, record in enumerate(records):
        if record.transaction_id != first + offset:
            raise _ReplicaFailed(
                f"{where}: partition {partition_id}: expected transaction {first + offset}, "
                f"got {record.transaction_id}"
            )
        if crc32(record.data) != record.checksum:
            raise _ReplicaFailed(
                f"{where}: partition {partition_id} transaction {record.transaction_id}: "
                "data checksum mismatch"
            )


class BadRecordsError(WaltzError):
    """What a :data:`RecordDecoder` raises for records that do not check out (another replica
    is tried)."""


# Decodes a RECORD_LIST answer's record list (int32 count, then the records as the original
# writes them) that should start at the txid given, of the partition given; returns the
# decoded batch and how many records it holds, or raises BadRecordsError. Every record's txid
# and data checksum must be checked.
RecordDecoder = Callable[[memoryview, int, int], tuple[T, int]]


def decode_records(payload: memoryview, first: int, partition_id: int) -> tuple[list[Record], int]:
    """The default decoder: one :class:`Record` each, checked."""
    records = list(read_records(payload, 0)[0])
    try:
        _check_records(records, first, partition_id, "records")
    except _ReplicaFailed as e:
        raise BadRecordsError(str(e)) from None
    return records, len(records)


async def _from_replica(
    part: NetworkSlice,
    replica: ReplicaSource,
    first: int,
    last: int,
    batch_records: int,
    in_flight: int,
    decode: RecordDecoder[T],
) -> AsyncIterator[tuple[T, int]]:
    """Txids ``first..last`` from one replica, in order, in checked batches (and their sizes)."""
    where = f"storage {replica.storage} (admin {replica.admin_address})"
    async with _admin_client(part.store, replica.host, replica.admin_port, raw=True) as admin:
        pending: deque[tuple[int, int, asyncio.Task[memoryview]]] = deque()
        next_request = first
        try:
            while True:
                while len(pending) < in_flight and next_request <= last:
                    count = min(batch_records, last - next_request + 1)
                    task = asyncio.create_task(admin.record_list_raw(part.partition_id, next_request, count))
                    pending.append((next_request, count, task))
                    next_request += count
                if not pending:
                    return
                start, count, task = pending.popleft()
                payload = await task
                try:
                    decoded, got = decode(payload, start, part.partition_id)
                except (BadRecordsError, ProtocolError) as e:
                    raise _ReplicaFailed(f"{where}: {e}") from None
                if got > count:
                    raise _ReplicaFailed(f"{where}: asked {count} records, got {got}")
                if not got:
                    raise _ReplicaFailed(f"{where}: partition {part.partition_id} has no transaction {start}")
                if got < count:
                    # A short answer (a segment's end): ask again from where it stopped.
                    for _, _, later in pending:
                        later.cancel()
                    await asyncio.gather(*(t for _, _, t in pending), return_exceptions=True)
                    pending.clear()
                    next_request = start + got
                yield decoded, got
        finally:
            for _, _, task in pending:
                task.cancel()
            await asyncio.gather(*(t for _, _, t in pending), return_exceptions=True)


async def stream_slice_runs(
    part: NetworkSlice,
    decode: RecordDecoder[T],
    batch_records: int = READ_BATCH_RECORDS,
    in_flight: int = REQUESTS_IN_FLIGHT,
) -> AsyncGenerator[T, None]:
    """Every record of ``part`` exactly once, in txid order, as ``decode`` makes batches of them,
    moving to another replica when one fails; :class:`NetworkReadError` once every replica that
    holds the rest failed :data:`ATTEMPTS_PER_REPLICA` times."""
    assert batch_records >= 1 and in_flight >= 1
    next_txid = part.from_txid
    failures: list[str] = []
    attempt = 0
    while next_txid <= part.to_txid:
        holders = [r for r in part.replicas if r.readable_to >= next_txid]
        if not holders or attempt >= ATTEMPTS_PER_REPLICA * len(holders):
            reasons = "; ".join(failures[-len(part.replicas) :]) or "no replica holds them"
            raise NetworkReadError(
                f"partition {part.partition_id}: transactions {next_txid}..{part.to_txid} could not be "
                f"read from any replica ({reasons})"
            )
        if attempt and attempt % len(holders) == 0:
            await asyncio.sleep(RETRY_PAUSE_MS / 1000)
        replica = holders[attempt % len(holders)]
        try:
            last = min(part.to_txid, replica.readable_to)
            async for decoded, got in _from_replica(
                part, replica, next_txid, last, batch_records, in_flight, decode
            ):
                yield decoded
                next_txid += got
        except (_ReplicaFailed, StorageRpcError, ConnectionClosedError, OSError, TimeoutError) as e:
            failures.append(str(e))
            attempt += 1
            log.info("partition %d: moving on from %s: %s", part.partition_id, replica.storage, e)


def stream_slice(
    part: NetworkSlice,
    batch_records: int = READ_BATCH_RECORDS,
    in_flight: int = REQUESTS_IN_FLIGHT,
) -> AsyncGenerator[list[Record], None]:
    """:func:`stream_slice_runs` as :class:`Record` lists."""
    return stream_slice_runs(part, decode_records, batch_records, in_flight)


def read_slice_runs(
    part: NetworkSlice,
    decode: RecordDecoder[T],
    batch_records: int = READ_BATCH_RECORDS,
    in_flight: int = REQUESTS_IN_FLIGHT,
) -> Iterator[T]:
    """:func:`stream_slice_runs` for synchronous callers (its own event loop; requests already
    in flight keep arriving in the socket's buffer while the caller works on a batch)."""
    if part.count == 0:
        return
    loop = asyncio.new_event_loop()
    runs = stream_slice_runs(part, decode, batch_records, in_flight)
    try:
        while True:
            try:
                batch = loop.run_until_complete(anext(runs))
            except StopAsyncIteration:
                return
            yield batch
    finally:
        loop.run_until_complete(runs.aclose())
        loop.close()


def read_slice_records(
    part: NetworkSlice,
    batch_records: int = READ_BATCH_RECORDS,
    in_flight: int = REQUESTS_IN_FLIGHT,
) -> Iterator[list[Record]]:
    """:func:`read_slice_runs` as :class:`Record` lists."""
    return read_slice_runs(part, decode_records, batch_records, in_flight)


__all__ = [
    "BadRecordsError",
    "ClusterAccess",
    "ClusterLayout",
    "NetworkReadError",
    "NetworkSlice",
    "PartitionSources",
    "RecordDecoder",
    "ReplicaSource",
    "StoreAccess",
    "committed_high_water_marks",
    "discover",
    "discover_async",
    "discover_from_loop",
    "decode_records",
    "read_slice_records",
    "read_slice_runs",
    "stream_slice",
    "stream_slice_runs",
]
