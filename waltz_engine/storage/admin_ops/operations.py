"""The operations on a storage node's admin and data ports: list, assign and unassign,
availability, sync, validate, max transaction id, each over its own bounded connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple

from waltz_engine.common.address import HostPort, parse_host_port
from waltz_engine.common.errors import WaltzError
from waltz_engine.disk.partition_info import FLAG_ASSIGNED, FLAG_AVAILABLE
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.admin_ops.layout import (
    DEFAULT_TIMEOUT_MS,
    GAUGE_PARTITION_IDS,
    StorageAdminError,
    StorageContext,
    StoreLayout,
    T,
)
from waltz_engine.storage.client import (
    StorageClient,
    StorageRpcError,
    StorageTimeoutError,
)
from waltz_engine.storage.damage import DAMAGE_GAUGE, SegmentDamage, format_ranges
from waltz_engine.storage.node.failures import JAVA_CONCURRENT_UPDATE_EXCEPTION
from waltz_engine.storage.tier.reads import USAGE_GAUGE
from waltz_engine.zk.partition_ranges import format_partition_ranges

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


_GAUGE_PARTITION_PREFIX = "waltz-storage.partition-"
# Our storage node's gauges (the original has neither): a partition's retained start, and the
# node's "I can begin a log late" (see ``starts_late``).
FIRST_TRANSACTION_ID_GAUGE = "first-transaction-id"
STARTS_LATE_GAUGE = "waltz-storage.waltz-storage-starts-late"
# How the client words a lost connection (``StorageRpcError("<client> <host:port>: disconnected (...)")``).
_DISCONNECTED = ": disconnected ("

# A partition's session may change between reading it and using it; how often to read it again.
SESSION_CHANGE_ATTEMPTS = 3
# How long to wait before reading it again, times the attempt: a node refuses the old session as
# soon as a recovering server opens the new one, but reports the new one only once the recovery
# has written it, a few round trips later; asked again at once, it can give the old one again.
SESSION_CHANGE_RETRY_DELAY_MS = 100


class NodeCallFailure(StorageAdminError):
    """Raised inside a node operation; carries whether reconnecting could help."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


async def call_node(context: StorageContext, what: str, call: Awaitable[T]) -> T:
    """One request, bounded; errors become one line saying what was being done."""
    try:
        return await call
    except (WaltzError, OSError) as e:
        raise NodeCallFailure(f"{what}: {_describe(e)}", _is_transient(e)) from e


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
        network=context.network,
    )
    try:
        await call_node(
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
        network=context.network,
    )
    try:
        await call_node(
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
        async with asyncio.timeout(DEFAULT_TIMEOUT_MS / 1000):
            await client.close()


# --- list ----------------------------------------------------------------------------------------


class PartitionStatus(NamedTuple):
    """One partition of a node, as ``list`` shows it (from the node's metrics gauges)."""

    partition_id: int
    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    flags: int
    # Segments the node holds damaged (our extension; a node that does not say has none).
    damaged: tuple[SegmentDamage, ...] = ()
    # Local and tier segments and bytes (issue 25; None from a node that does not say).
    usage: dict[str, int] | None = None
    # The first txid it holds, above 0 once retention removed its head (None: a node that does
    # not say, the original's, which never removes any).
    first_transaction_id: int | None = None

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
            "damaged": [d.to_json() for d in self.damaged],
            "usage": self.usage,
            "first_transaction_id": self.first_transaction_id,
        }

    def describe_usage(self) -> tuple[str, str]:
        """(local, tier): segments and bytes on the node's disk, and in the tier (of which evicted)."""
        u = self.usage
        if u is None:
            return "?", "?"
        return (
            f"{u['local_segments']} seg, {u['local_bytes']} B",
            f"{u['tier_segments']} seg, {u['tier_bytes']} B ({u['evicted_segments']} only there)",
        )

    def describe_damage(self) -> str:
        """``none``, or the damaged transactions (a segment whose records are all whole: its name)."""
        if not self.damaged:
            return "none"
        return ", ".join(format_ranges(d.transactions) or f"segment {d.segment} files" for d in self.damaged)


class NodePartitions(NamedTuple):
    address: HostPort  # where its admin port was reached
    partitions: list[PartitionStatus]
    storage: str | None = None  # its data connect string as registered in ZooKeeper, if known
    # Whether the node can begin a partition's log above 0 (ours; the original's cannot).
    starts_late: bool = False

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
        damaged = damaged_segments(metrics, partition_id, address)
        usage = _usage(gauges.get(f"{_GAUGE_PARTITION_PREFIX}{partition_id}.{USAGE_GAUGE}"))
        first = gauges.get(f"{_GAUGE_PARTITION_PREFIX}{partition_id}.{FIRST_TRANSACTION_ID_GAUGE}")
        first_value = first.get("value") if isinstance(first, dict) else None
        statuses.append(
            PartitionStatus(
                partition_id,
                session_id,
                low_water_mark,
                local_low_water_mark,
                flags,
                damaged,
                usage,
                first_value if isinstance(first_value, int) and not isinstance(first_value, bool) else None,
            )
        )
    return statuses


def starts_late(metrics: dict[str, Any]) -> bool:
    """Whether the node of these metrics can begin a partition's log above transaction 0 (a
    replica filled after retention removed the head elsewhere): ours say so with a gauge; a Java
    0.13.2 node has neither it nor any partition's ``first-transaction-id``."""
    gauges = metrics.get("gauges")
    if not isinstance(gauges, dict):
        return False
    if STARTS_LATE_GAUGE in gauges:
        return True
    return any(
        name.startswith(_GAUGE_PARTITION_PREFIX) and name.endswith(f".{FIRST_TRANSACTION_ID_GAUGE}")
        for name in gauges
    )


def _usage(entry: Any) -> dict[str, int] | None:
    value = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
        return None
    return {str(k): int(v) for k, v in value.items()}


def damaged_segments(
    metrics: dict[str, Any], partition_id: int, address: HostPort
) -> tuple[SegmentDamage, ...]:
    """The damaged segments a node's metrics list for a partition (none when it does not say)."""
    gauges = metrics.get("gauges")
    name = f"{_GAUGE_PARTITION_PREFIX}{partition_id}.{DAMAGE_GAUGE}"
    entry = gauges.get(name) if isinstance(gauges, dict) else None
    value = entry.get("value") if isinstance(entry, dict) else None
    if value is None:
        return ()
    try:
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not a list")
        return tuple(SegmentDamage.from_json(v) for v in value)
    except ValueError as e:
        raise StorageAdminError(f"Cannot read the damaged segments of {address}: {e}") from None


async def list_partitions(
    context: StorageContext, address: HostPort, storage: str | None = None
) -> NodePartitions:
    """Partition ownership of one node (admin METRICS_REQUEST); ``storage``: its registered name."""
    try:
        async with admin_client(context, address) as admin:
            metrics = await call_node(context, f"metrics request to {address}", admin.metrics())
    except NodeCallFailure as e:
        raise StorageAdminError(f"Cannot fetch partition ownership for {address}: {e}") from None
    return NodePartitions(
        address, partition_status_from_metrics(metrics, address), storage, starts_late(metrics)
    )


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
            return await call_node(context, f"request to {address}", request(admin))
    except NodeCallFailure as e:
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
                status = await call_node(
                    context, f"partition status request to {address}", admin.assigned_partition_status()
                )
                to_assign, to_unassign = plan_sync(wanted, status)
                if to_assign:
                    await call_node(
                        context,
                        f"assigning {format_partition_ranges(to_assign)} on {address}",
                        admin.set_partition_assignment(to_assign, True, False),
                    )
                if to_unassign:
                    await call_node(
                        context,
                        f"un-assigning {format_partition_ranges(to_unassign)} on {address}",
                        admin.set_partition_assignment(to_unassign, False, False),
                    )
        except NodeCallFailure as e:
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
        except NodeCallFailure as e:
            return EndpointCheck(storage, "data", address, f"Invalid hostname or port: {e}")
        return EndpointCheck(storage, "data", address, None)

    async def admin(storage: str) -> EndpointCheck:
        address = layout.admin_address(storage)
        try:
            async with admin_client(context, address):
                pass
        except NodeCallFailure as e:
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
    unavailable on the node (issue #3). A live partition's session can change between the two
    requests (a server recovering it opens a new one): the session is read again and the
    question asked again, at most :data:`SESSION_CHANGE_ATTEMPTS` times.
    """
    context.check_partitions([partition_id])
    data_address = HostPort(admin_address.host, data_port)
    try:
        for attempt in range(1, SESSION_CHANGE_ATTEMPTS + 1):
            async with admin_client(context, admin_address) as admin:
                info = await call_node(
                    context,
                    f"last session info request to {admin_address}",
                    admin.last_session_info(partition_id),
                )
            try:
                async with data_client(context, data_address, used_by_offline_recovery=offline) as client:
                    return await call_node(
                        context,
                        f"max transaction id request to {data_address}",
                        client.max_transaction_id(info.session_id, partition_id),
                    )
            except NodeCallFailure as e:
                if attempt == SESSION_CHANGE_ATTEMPTS or JAVA_CONCURRENT_UPDATE_EXCEPTION not in str(e):
                    raise
            await asyncio.sleep(attempt * SESSION_CHANGE_RETRY_DELAY_MS / 1000)
        raise AssertionError("unreachable: the last attempt returns or raises")
    except NodeCallFailure as e:
        raise StorageAdminError(
            f"Failed to read max transaction ID for storage {admin_address}. {e}"
        ) from None
