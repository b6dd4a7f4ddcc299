"""Storage node administration: the original's ``StorageCli`` operations as a library (reference §4.2).

Every operation opens its own bounded connections (OPEN with the cluster key and partition
count from ZooKeeper's StoreParams), does its work and closes them, and returns plain data.
A node answering FAILURE, a node that cannot be reached, and bad input all raise
:class:`StorageAdminError` with one line naming the node and, where there is one, the node's
own message. The CLI (``waltz storage ...``) is a thin skin over these functions.

``recover_partition`` is the original's ``StorageRecoveryRunnable``; ``replica_checksums`` is
its ``WaltzStorage.checksums`` (CRC-32 over every segment's bytes after the 128-byte header),
computed on a directory whose node is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from kazoo.client import KazooClient

from waltz_engine.address import HostPort, parse_host_port
from waltz_engine.config import Config
from waltz_engine.disk.partition_info import FLAG_ASSIGNED, FLAG_AVAILABLE
from waltz_engine.errors import WaltzError
from waltz_engine.net import ConnectionClosedError
from waltz_engine.storage.client import (
    StorageAdminClient,
    StorageClient,
    StorageRpcError,
    StorageTimeoutError,
)
from waltz_engine.storage.constants import CONTROL_FILE_NAME
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.tls import TlsConfig, client_context
from waltz_engine.zk import store_metadata
from waltz_engine.zk.partition_ranges import format_partition_ranges

T = TypeVar("T")

# Connect + TLS + Hello + OPEN, and then every single request, must answer within this.
DEFAULT_TIMEOUT_MS = 10_000
# The original's StorageRecoveryRunnable.MAX_BATCH_SIZE.
DEFAULT_RECOVERY_BATCH_SIZE = 20
# One RECORD_LIST answer is held in memory and re-sent as one APPEND frame.
MAX_RECOVERY_BATCH_SIZE = 10_000
# A dropped connection or a timeout restarts the recovery from the destination's last
# low-water mark (set after every batch), at most this many times in all.
RECOVERY_MAX_ATTEMPTS = 3
RECOVERY_RETRY_BACKOFF_MS = 200
# The original logs recovery progress every this many transactions.
RECOVERY_LOG_INTERVAL_TXNS = 10_000

# The original's StorageCli reads its TLS keys under `server.ssl.` (WaltzServerConfig's prefix).
SSL_CONFIG_PREFIX = "server"
GAUGE_PARTITION_IDS = "waltz-storage.waltz-storage-partition-ids"
_GAUGE_PARTITION_PREFIX = "waltz-storage.partition-"
NO_TRANSACTION = -1
# How the client words a lost connection (``StorageRpcError("<client> <host:port>: disconnected (...)")``).
_DISCONNECTED = ": disconnected ("


class StorageAdminError(WaltzError):
    """An admin operation failed: bad input, an unreachable node, or the node's FAILURE answer."""


# What ``--storage`` of the admin commands takes: a node's data address as registered in
# ZooKeeper, or its admin address (the original's StorageCli form).
STORAGE_ADDRESS_FORM = "host:port (the data address as registered, or host:admin_port)"


def parse_admin_address(text: str) -> HostPort:
    """A storage node's ``host:admin_port``, as the original's StorageCli takes ``--storage``."""
    return parse_host_port(text, "Storage", "host:admin_port")


def parse_storage_address(text: str) -> HostPort:
    """A storage node's data or admin address, ``host:port`` (see :meth:`StoreLayout.resolve_node`)."""
    return parse_host_port(text, "Storage", STORAGE_ADDRESS_FORM)


class StorageNode(NamedTuple):
    """Where one storage node answers: its admin port, and its data port when known."""

    admin: HostPort
    data: HostPort | None  # None: an admin address of a node not registered in ZooKeeper
    storage: str | None  # its data connect string as registered in ZooKeeper, if it is

    def data_port(self, explicit: int | None = None) -> int:
        """``explicit`` (``--storage-port``), else the registered data port."""
        if explicit is not None:
            return explicit
        if self.data is None:
            raise StorageAdminError(
                f"storage node {self.admin} is not registered in ZooKeeper (store/connection): "
                "pass its data address as registered, or its data port with --storage-port"
            )
        return self.data.port


@dataclass(frozen=True)
class StorageContext:
    """What every connection to a storage node of one cluster needs."""

    key: uuid.UUID
    num_partitions: int
    ssl_context: ssl.SSLContext
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __post_init__(self) -> None:
        assert self.num_partitions >= 0
        if self.timeout_ms <= 0:
            raise StorageAdminError(f"timeout must be positive, got {self.timeout_ms} ms")

    def check_partitions(self, partition_ids: Sequence[int]) -> list[int]:
        return check_partitions(partition_ids, self.num_partitions)


def check_partitions(partition_ids: Sequence[int], num_partitions: int) -> list[int]:
    """Sorted, unique ids, all inside the cluster (message as ``ZooKeeperCli``'s)."""
    ids = sorted(set(partition_ids))
    if not ids:
        raise StorageAdminError("no partition given")
    if ids[0] < 0 or ids[-1] >= num_partitions:
        if not num_partitions:
            raise StorageAdminError("the cluster has no partitions")
        outside = format_partition_ranges([p for p in ids if not 0 <= p < num_partitions])
        raise StorageAdminError(
            f"One or more partition(s) in [{ids[0]}, {ids[-1]}] does not belong to the cluster: "
            f"{outside} (the cluster has partitions 0-{num_partitions - 1})"
        )
    return ids


def client_ssl_context(ssl_config: Path | None) -> ssl.SSLContext:
    """TLS for connections to storage nodes from ``server.ssl.*`` keys of a YAML file; without
    a file (or keys), the original's insecure client context (no server verification)."""
    if ssl_config is None:
        return client_context(TlsConfig())
    return client_context(TlsConfig.from_flat(Config.load(ssl_config).as_dict(), SSL_CONFIG_PREFIX))


class StoreLayout(NamedTuple):
    """The storage part of a cluster's ZooKeeper metadata, read once."""

    key: uuid.UUID
    num_partitions: int
    assignments: dict[str, tuple[int, ...]]  # data connect string → partitions (store/assignment)
    groups: dict[str, int]  # data connect string → group (store/group)
    admin_ports: dict[str, int]  # data connect string → admin port (store/connection)

    def context(self, ssl_context: ssl.SSLContext, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> StorageContext:
        return StorageContext(self.key, self.num_partitions, ssl_context, timeout_ms)

    def admin_address(self, storage: str) -> HostPort:
        """The original takes the host of the data connect string and the registered admin port."""
        port = self.admin_ports.get(storage)
        if port is None:
            raise StorageAdminError(
                f"storage node {storage} has no admin port in ZooKeeper (store/connection)"
            )
        return HostPort(parse_host_port(storage).host, port)

    def resolve_node(self, text: str) -> StorageNode:
        """A node named by its data address as registered (admin port from store/connection)
        or by its admin address; an address that matches neither is taken as an admin
        address, as the original's StorageCli does."""
        address = parse_storage_address(text)
        registered = {*self.admin_ports, *self.groups, *self.assignments}
        for storage in sorted(registered):
            if _same_address(storage, address):
                return StorageNode(self.admin_address(storage), parse_host_port(storage), storage)
        for storage, admin_port in sorted(self.admin_ports.items()):
            data = _registered_address(storage)
            if data is not None and data.host.lower() == address.host.lower() and admin_port == address.port:
                return StorageNode(address, data, storage)
        return StorageNode(address, None, None)


def _registered_address(storage: str) -> HostPort | None:
    try:
        return parse_host_port(storage)
    except WaltzError:
        return None


def _same_address(storage: str, address: HostPort) -> bool:
    registered = _registered_address(storage)
    return registered is not None and (registered.host.lower(), registered.port) == (
        address.host.lower(),
        address.port,
    )


def read_store_layout(client: KazooClient, root: str) -> StoreLayout:
    params = store_metadata.read_store_params(client, root)
    return StoreLayout(
        params.key,
        params.num_partitions,
        store_metadata.read_replica_assignments(client, root).as_dict(),
        store_metadata.read_group_descriptor(client, root).as_dict(),
        store_metadata.read_connection_metadata(client, root).as_dict(),
    )


# --- connections -----------------------------------------------------------------------------


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _is_transient(error: BaseException) -> bool:
    """A lost connection or a timeout: worth reconnecting; a FAILURE answer is not."""
    if isinstance(error, OSError | ConnectionClosedError):
        return True
    if isinstance(error, StorageTimeoutError):
        return True
    return isinstance(error, StorageRpcError) and _DISCONNECTED in str(error)


class _Failure(StorageAdminError):
    """Raised inside a node operation; carries whether reconnecting could help."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


async def _call(context: StorageContext, what: str, call: Awaitable[T]) -> T:
    """One request, bounded; errors become one line saying what was being done."""
    try:
        return await call
    except (WaltzError, OSError) as e:
        raise _Failure(f"{what}: {_describe(e)}", _is_transient(e)) from e


@contextlib.asynccontextmanager
async def admin_client(context: StorageContext, address: HostPort) -> AsyncIterator[StorageAdminClient]:
    """An open admin connection (OPEN accepted by the node), closed on exit."""
    client = StorageAdminClient(
        address.host,
        address.port,
        context.ssl_context,
        context.key,
        context.num_partitions,
        request_timeout_ms=context.timeout_ms,
    )
    try:
        await _call(
            context,
            f"cannot open storage admin connection to {address}",
            client.open(timeout_ms=context.timeout_ms),
        )
        yield client
    finally:
        await _close(client)


@contextlib.asynccontextmanager
async def data_client(
    context: StorageContext, address: HostPort, *, used_by_offline_recovery: bool = False
) -> AsyncIterator[StorageClient]:
    """An open data-port connection, optionally in offline-recovery mode, closed on exit."""
    client = StorageClient(
        address.host,
        address.port,
        context.ssl_context,
        context.key,
        context.num_partitions,
        used_by_offline_recovery=used_by_offline_recovery,
        request_timeout_ms=context.timeout_ms,
    )
    try:
        await _call(
            context,
            f"cannot open storage connection to {address}",
            client.open(timeout_ms=context.timeout_ms),
        )
        yield client
    finally:
        await _close(client)


async def _close(client: StorageAdminClient | StorageClient) -> None:
    # Closing must not hide the error that got us here, nor hang on a dead peer.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), DEFAULT_TIMEOUT_MS / 1000)


# --- list ----------------------------------------------------------------------------------------


class PartitionStatus(NamedTuple):
    """One partition of a node, as ``list`` shows it (from the node's metrics gauges)."""

    partition_id: int
    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    flags: int

    @property
    def is_assigned(self) -> bool:
        return bool(self.flags & FLAG_ASSIGNED)

    @property
    def is_available(self) -> bool:
        return bool(self.flags & FLAG_AVAILABLE)

    def to_json(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "session_id": self.session_id,
            "low_water_mark": self.low_water_mark,
            "local_low_water_mark": self.local_low_water_mark,
            "is_assigned": self.is_assigned,
            "is_available": self.is_available,
        }


class NodePartitions(NamedTuple):
    address: HostPort  # where its admin port was reached
    partitions: list[PartitionStatus]
    storage: str | None = None  # its data connect string as registered in ZooKeeper, if known

    def to_json(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "admin": str(self.address),
            "partitions": [p.to_json() for p in self.partitions],
        }


def _gauge(gauges: dict[str, Any], name: str, address: HostPort) -> Any:
    entry = gauges.get(name)
    if not isinstance(entry, dict) or "value" not in entry:
        raise StorageAdminError(f"Cannot fetch partition ownership for {address}: no gauge {name} in metrics")
    return entry["value"]


def _int_value(value: Any, name: str, address: HostPort) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise StorageAdminError(f"Cannot fetch partition ownership for {address}: gauge {name} is {value!r}")
    try:
        return int(value)
    except ValueError:
        raise StorageAdminError(
            f"Cannot fetch partition ownership for {address}: gauge {name} is {value!r}"
        ) from None


def partition_status_from_metrics(metrics: dict[str, Any], address: HostPort) -> list[PartitionStatus]:
    """What ``ListPartition.getPartitionInfo`` reads from the METRICS_RESPONSE JSON.

    Unlike the original (``asInt``), session ids and watermarks keep their full 64 bits, and a
    partition whose gauges read null (closed while the metrics were taken) is left out.
    """
    gauges = metrics.get("gauges")
    if not isinstance(gauges, dict):
        raise StorageAdminError(f"Cannot fetch partition ownership for {address}: metrics have no gauges")
    ids = _gauge(gauges, GAUGE_PARTITION_IDS, address)
    if not isinstance(ids, list):
        raise StorageAdminError(
            f"Cannot fetch partition ownership for {address}: {GAUGE_PARTITION_IDS} is {ids!r}"
        )
    statuses = []
    for partition_id in sorted(_int_value(p, GAUGE_PARTITION_IDS, address) for p in ids):
        names = [
            f"{_GAUGE_PARTITION_PREFIX}{partition_id}.{field}"
            for field in ("session-id", "low-water-mark", "local-low-water-mark", "flags")
        ]
        raw = [_gauge(gauges, name, address) for name in names]
        if any(value is None for value in raw):
            continue
        session_id, low_water_mark, local_low_water_mark, flags = (
            _int_value(value, name, address) for value, name in zip(raw, names, strict=True)
        )
        statuses.append(
            PartitionStatus(partition_id, session_id, low_water_mark, local_low_water_mark, flags)
        )
    return statuses


async def list_partitions(
    context: StorageContext, address: HostPort, storage: str | None = None
) -> NodePartitions:
    """Partition ownership of one node (admin METRICS_REQUEST); ``storage``: its registered name."""
    try:
        async with admin_client(context, address) as admin:
            metrics = await _call(context, f"metrics request to {address}", admin.metrics())
    except _Failure as e:
        raise StorageAdminError(f"Cannot fetch partition ownership for {address}: {e}") from None
    return NodePartitions(address, partition_status_from_metrics(metrics, address), storage)


async def list_all_partitions(context: StorageContext, layout: StoreLayout) -> list[NodePartitions]:
    """``list`` without ``--storage``: every node registered in store/connection, in name order."""
    return [await list_partitions(context, layout.admin_address(s), s) for s in sorted(layout.admin_ports)]


# --- assignment and availability ------------------------------------------------------------


async def _admin_request(
    context: StorageContext,
    address: HostPort,
    failure: str,
    request: Callable[[StorageAdminClient], Awaitable[T]],
) -> T:
    try:
        async with admin_client(context, address) as admin:
            return await _call(context, f"request to {address}", request(admin))
    except _Failure as e:
        raise StorageAdminError(f"{failure}: {e}") from None


async def add_partitions(
    context: StorageContext, address: HostPort, partition_ids: Sequence[int]
) -> list[int]:
    """Assign partitions to a node (PARTITION_ASSIGNMENT_REQUEST(ids, true, false))."""
    ids = context.check_partitions(partition_ids)
    await _admin_request(
        context,
        address,
        f"Failed to add partition {format_partition_ranges(ids)} to {address}",
        lambda admin: admin.set_partition_assignment(ids, True, False),
    )
    return ids


async def remove_partitions(
    context: StorageContext, address: HostPort, partition_ids: Sequence[int], *, delete_storage_files: bool
) -> list[int]:
    """Un-assign partitions; their segment files are deleted only with ``delete_storage_files``."""
    ids = context.check_partitions(partition_ids)
    await _admin_request(
        context,
        address,
        f"Failed to remove partition {format_partition_ranges(ids)} from {address}",
        lambda admin: admin.set_partition_assignment(ids, False, delete_storage_files),
    )
    return ids


async def set_availability(
    context: StorageContext, address: HostPort, partition_ids: Sequence[int], *, online: bool
) -> list[int]:
    """Turn reads and writes of partitions on or off (PARTITION_AVAILABLE_REQUEST)."""
    ids = context.check_partitions(partition_ids)
    await _admin_request(
        context,
        address,
        f"Failed to set availability of partition {format_partition_ranges(ids)} to "
        f"{str(online).lower()} for {address}",
        lambda admin: admin.set_partition_available(ids, online),
    )
    return ids


class SyncResult(NamedTuple):
    storage: str  # data connect string, as in ZooKeeper
    address: HostPort  # where its admin port was reached
    assigned: list[int]
    unassigned: list[int]

    def to_json(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "admin": str(self.address),
            "assigned": self.assigned,
            "unassigned": self.unassigned,
        }


def plan_sync(wanted: Iterable[int], status: dict[int, bool]) -> tuple[list[int], list[int]]:
    """(to assign, to un-assign): assign what ZooKeeper wants unless already assigned *and*
    available; un-assign (keeping files) what the node holds beyond that (PR #94)."""
    wanted_ids = set(wanted)
    to_assign = sorted(p for p in wanted_ids if not status.get(p, False))
    to_unassign = sorted(p for p in status if p not in wanted_ids)
    return to_assign, to_unassign


async def sync_partitions(context: StorageContext, layout: StoreLayout) -> list[SyncResult]:
    """Make every node in store/assignment hold exactly the partitions ZooKeeper assigns it."""
    results = []
    for storage, wanted in sorted(layout.assignments.items()):
        address = layout.admin_address(storage)
        try:
            async with admin_client(context, address) as admin:
                status = await _call(
                    context, f"partition status request to {address}", admin.assigned_partition_status()
                )
                to_assign, to_unassign = plan_sync(wanted, status)
                if to_assign:
                    await _call(
                        context,
                        f"assigning {format_partition_ranges(to_assign)} on {address}",
                        admin.set_partition_assignment(to_assign, True, False),
                    )
                if to_unassign:
                    await _call(
                        context,
                        f"un-assigning {format_partition_ranges(to_unassign)} on {address}",
                        admin.set_partition_assignment(to_unassign, False, False),
                    )
        except _Failure as e:
            raise StorageAdminError(f"Partition assignment cannot be fully synced. {e}") from None
        results.append(SyncResult(storage, address, to_assign, to_unassign))
    return results


# --- validate ------------------------------------------------------------------------------------


class EndpointCheck(NamedTuple):
    storage: str  # data connect string, as in ZooKeeper
    port_kind: str  # "data" or "admin"
    address: HostPort
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "port": self.port_kind,
            "address": str(self.address),
            "error": self.error,
        }


async def validate(context: StorageContext, layout: StoreLayout) -> list[EndpointCheck]:
    """Open the data port of every node in store/group and the admin port of every node in
    store/connection (concurrently, each bounded); report each endpoint."""

    async def data(storage: str) -> EndpointCheck:
        address = parse_host_port(storage)
        try:
            async with data_client(context, address):
                pass
        except _Failure as e:
            return EndpointCheck(storage, "data", address, f"Invalid hostname or port: {e}")
        return EndpointCheck(storage, "data", address, None)

    async def admin(storage: str) -> EndpointCheck:
        address = layout.admin_address(storage)
        try:
            async with admin_client(context, address):
                pass
        except _Failure as e:
            return EndpointCheck(storage, "admin", address, f"Invalid hostname or admin port: {e}")
        return EndpointCheck(storage, "admin", address, None)

    checks = [data(s) for s in sorted(layout.groups)] + [admin(s) for s in sorted(layout.admin_ports)]
    return list(await asyncio.gather(*checks))


# --- max transaction id ---------------------------------------------------------------------------


async def max_transaction_id(
    context: StorageContext, admin_address: HostPort, data_port: int, partition_id: int, *, offline: bool
) -> int:
    """Session id from admin LAST_SESSION_INFO, then MAX_TRANSACTION_ID on the data port with it.

    ``offline`` sends the request in offline-recovery mode: the partition must then be
    unavailable on the node (issue #3).
    """
    context.check_partitions([partition_id])
    data_address = HostPort(admin_address.host, data_port)
    try:
        async with admin_client(context, admin_address) as admin:
            info = await _call(
                context,
                f"last session info request to {admin_address}",
                admin.last_session_info(partition_id),
            )
        async with data_client(context, data_address, used_by_offline_recovery=offline) as client:
            return await _call(
                context,
                f"max transaction id request to {data_address}",
                client.max_transaction_id(info.session_id, partition_id),
            )
    except _Failure as e:
        raise StorageAdminError(
            f"Failed to read max transaction ID for storage {admin_address}. {e}"
        ) from None


# --- recovery --------------------------------------------------------------------------------


class RecoveryProgress(NamedTuple):
    partition_id: int
    start: int  # the destination's max txid after truncation to its low-water mark
    current: int  # the destination's max txid (and low-water mark) now
    target: int  # the source's local low-water mark when the recovery began

    @property
    def fraction(self) -> float:
        span = self.target - self.start
        return 1.0 if span <= 0 else (self.current - self.start) / span


class RecoveryResult(NamedTuple):
    partition_id: int
    destination_session_id: int
    start: int
    target: int
    final: int
    records_copied: int
    attempts: int

    def to_json(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "destination_session_id": self.destination_session_id,
            "start": self.start,
            "target": self.target,
            "max_transaction_id": self.final,
            "records_copied": self.records_copied,
            "attempts": self.attempts,
        }


def check_batch_size(batch_size: int) -> int:
    if not 0 < batch_size <= MAX_RECOVERY_BATCH_SIZE:
        raise StorageAdminError(
            f"Batch size must be a positive integer up to {MAX_RECOVERY_BATCH_SIZE}, got {batch_size}"
        )
    return batch_size


@dataclass
class _RecoveryState:
    target: int | None = None
    start: int | None = None
    session_id: int = NO_TRANSACTION
    copied: int = 0


async def _recover_once(
    source: StorageContext,
    destination: StorageContext,
    source_admin_address: HostPort,
    destination_admin_address: HostPort,
    destination_data_port: int,
    partition_id: int,
    batch_size: int,
    state: _RecoveryState,
    progress: Callable[[RecoveryProgress], None],
) -> int:
    data_address = HostPort(destination_admin_address.host, destination_data_port)
    async with (
        admin_client(source, source_admin_address) as source_admin,
        admin_client(destination, destination_admin_address) as destination_admin,
        data_client(destination, data_address, used_by_offline_recovery=True) as destination_data,
    ):
        info = await _call(
            destination,
            f"last session info request to {destination_admin_address}",
            destination_admin.last_session_info(partition_id),
        )
        session_id = state.session_id = info.session_id
        await _call(
            destination,
            f"max transaction id request to {data_address}",
            destination_data.max_transaction_id(session_id, partition_id),
        )
        current = await _call(
            destination,
            f"truncating {data_address} to its low-water mark {info.low_water_mark}",
            destination_data.truncate(session_id, partition_id, info.low_water_mark),
        )
        if state.target is None:
            # Fixed at the first start, as the original: re-run to catch up further.
            source_info = await _call(
                source,
                f"last session info request to {source_admin_address}",
                source_admin.last_session_info(partition_id),
            )
            state.target = source_info.local_low_water_mark
        target = state.target
        if state.start is None:
            state.start = current
        progress(RecoveryProgress(partition_id, state.start, current, target))
        while current < target:
            count = min(target - current, batch_size)
            records = await _call(
                source,
                f"record list request to {source_admin_address}",
                source_admin.record_list(partition_id, current + 1, count),
            )
            if not records:
                raise _Failure(
                    f"source {source_admin_address} returned no record at transaction {current + 1} "
                    f"(below its local low-water mark {target})",
                    transient=False,
                )
            await _call(
                destination,
                f"append to {data_address}",
                destination_data.append(session_id, partition_id, records),
            )
            current += len(records)
            await _call(
                destination,
                f"setting the low-water mark of {data_address} to {current}",
                destination_data.set_low_water_mark(session_id, partition_id, current),
            )
            state.copied += len(records)
            progress(RecoveryProgress(partition_id, state.start, current, target))
        return current


async def recover_partition(
    context: StorageContext,
    source_admin_address: HostPort,
    destination_admin_address: HostPort,
    destination_data_port: int,
    partition_id: int,
    *,
    batch_size: int = DEFAULT_RECOVERY_BATCH_SIZE,
    source_ssl_context: ssl.SSLContext | None = None,
    destination_ssl_context: ssl.SSLContext | None = None,
    progress: Callable[[RecoveryProgress], None] = lambda _: None,
) -> RecoveryResult:
    """Copy a partition from a source node to a destination whose copy is offline (unavailable).

    As ``StorageRecoveryRunnable``: destination admin LAST_SESSION_INFO → (session, lwm);
    destination data client in offline-recovery mode; MAX_TRANSACTION_ID; TRUNCATE to the lwm;
    target = the source's local low-water mark; then RECORD_LIST from the source admin port →
    APPEND → SET_LOW_WATER_MARK, batch by batch. A lost connection or a timeout restarts from
    the destination's last low-water mark, up to ``RECOVERY_MAX_ATTEMPTS`` runs in all.
    """
    context.check_partitions([partition_id])
    check_batch_size(batch_size)
    source = replace(context, ssl_context=source_ssl_context or context.ssl_context)
    destination = replace(context, ssl_context=destination_ssl_context or context.ssl_context)
    state = _RecoveryState()
    backoff_ms = RECOVERY_RETRY_BACKOFF_MS
    for attempt in range(1, RECOVERY_MAX_ATTEMPTS + 1):
        try:
            final = await _recover_once(
                source,
                destination,
                source_admin_address,
                destination_admin_address,
                destination_data_port,
                partition_id,
                batch_size,
                state,
                progress,
            )
        except _Failure as e:
            if not e.transient or attempt == RECOVERY_MAX_ATTEMPTS:
                tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                raise StorageAdminError(f"Partition {partition_id} failed to recover{tries}. {e}") from None
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms *= 2
            continue
        assert state.target is not None and state.start is not None
        return RecoveryResult(
            partition_id, state.session_id, state.start, state.target, final, state.copied, attempt
        )
    raise AssertionError("unreachable: the last attempt returns or raises")


# --- replica checksums ------------------------------------------------------------------------


def replica_checksums(
    directory: Path, key: uuid.UUID, num_partitions: int, partition_ids: Sequence[int] | None = None
) -> dict[int, int]:
    """Per partition, CRC-32 (signed, as Java) over every segment's bytes after its header.

    Equal values on two nodes mean equal copies. The node of ``directory`` must be stopped:
    the control file is locked (and the partitions opened, recovering any torn tail) as the
    original's ``WaltzStorage.checksums`` does. Default: every assigned partition.
    """
    if not (directory / CONTROL_FILE_NAME).is_file():
        raise StorageAdminError(f"{directory} is not a storage directory (no {CONTROL_FILE_NAME})")
    with StorageManager(directory, key, num_partitions) as manager:
        assigned = manager.assigned_partition_ids()
        wanted = assigned if partition_ids is None else sorted(set(partition_ids))
        missing = [p for p in wanted if p not in assigned]
        if missing:
            raise StorageAdminError(
                f"partition {format_partition_ranges(missing)} is not assigned in {directory}"
            )
        return {p: manager.partition(p).checksum() for p in wanted}
