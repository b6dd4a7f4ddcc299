"""Cluster operations: the original's ``ClusterCli`` and ``ServerCli`` as a library (§4.3, §4.5),
plus what the original lacked: forced server assignment (its issue #6), starting a store
session from a tool (``recover_partition``) and an offline tail cut (``truncate_partition``).

Every function returns plain data and raises :class:`ClusterOpsError` (one line) for bad
input or an operation that cannot be done; the CLI is a thin skin over them. ZooKeeper reads
are blocking (kazoo) and happen before any network call, as one :class:`ClusterView`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from kazoo.client import KazooClient

from waltz_engine.address import HostPort, parse_host_port
from waltz_engine.errors import WaltzError
from waltz_engine.server.rpc_client import ServerRpcClient, ServerRpcError
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StorageAdminError, StorageContext
from waltz_engine.tls import TlsConfig, client_context
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import read_cluster_params, read_partition_assignment, read_server_descriptors
from waltz_engine.zk.cluster_manager import force_assign, force_unassign, read_forced_assignments
from waltz_engine.zk.connection import load_tool_config
from waltz_engine.zk.payloads import PartitionAssignment, PartitionMetadata, ServerDescriptor
from waltz_engine.zk.znodes import NO_VERSION

T = TypeVar("T")

DEFAULT_VERIFY_TIMEOUT_S = 10  # ClusterCli verify's --timeout default
DEFAULT_TIMEOUT_MS = 10_000
# The original tools read TLS keys under `ssl.` in their CLI config (CliConfig.SSL_CONFIG_PREFIX).
TOOLS_SSL_PREFIX = "ssl."
_TLS_HOLDER_PREFIX = "tools"  # TlsConfig.from_flat reads `<prefix>.ssl.*`
METRICS_PATH = "/metrics"
GAUGE_NUM_PARTITIONS = "waltz-server.waltz-server-num-partitions"
GAUGE_REPLICA_INFO = "waltz-server.replica-info"
LINE_SEPARATOR = "\n"  # Java's System.lineSeparator() on the platforms Waltz ran on
NO_SERVER = 0  # server ids start at 1: 0 marks "no server yet" as the original's int[]
NO_TRANSACTION = -1


class ClusterOpsError(WaltzError):
    """A cluster operation was refused or failed; the message is one line for an operator."""


def tools_ssl_context(config_path: Path | None) -> ssl.SSLContext:
    """TLS for a tool's connections from ``ssl.*`` keys of its YAML (the original's CliConfig);
    without a file or keys, the original's insecure client context."""
    config = load_tool_config(config_path)
    if config is None:
        return client_context(TlsConfig())
    flat = config.as_dict()
    scoped = {f"{_TLS_HOLDER_PREFIX}.{k}": v for k, v in flat.items() if k.startswith(TOOLS_SSL_PREFIX)}
    return client_context(TlsConfig.from_flat(scoped, _TLS_HOLDER_PREFIX))


def java_list(values: Sequence[Any]) -> str:
    """``java.util.List.toString()``: ``[1, 2, 3]``."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def java_bool_map(values: dict[str, bool]) -> str:
    """``java.util.Map.toString()`` of storage → bool, in name order: ``{a=true, b=false}``."""
    return "{" + ", ".join(f"{k}={str(v).lower()}" for k, v in sorted(values.items())) + "}"


# --- what ZooKeeper says ---------------------------------------------------------------------


class ClusterView(NamedTuple):
    """Everything verify and check-connectivity read from ZooKeeper, read once."""

    num_partitions: int  # the cluster's (ClusterParams)
    assignment: PartitionAssignment
    servers: tuple[ServerDescriptor, ...]  # live servers, by id
    store_key: uuid.UUID
    store_num_partitions: int
    replica_assignments: dict[str, tuple[int, ...]]  # storage data connect string → partitions
    storage_admin_ports: dict[str, int]  # storage data connect string → admin port
    partition_metadata: dict[int, PartitionMetadata | None]  # None: no znode, or unreadable

    def partitions_of(self, server_id: int) -> list[int]:
        return [
            p.partition_id for s in self.assignment.servers if s.server_id == server_id for p in s.partitions
        ]

    def replicas_of(self, partition_id: int) -> set[str]:
        return {storage for storage, ids in self.replica_assignments.items() if partition_id in ids}

    def storage_context(self, ssl_context: ssl.SSLContext, timeout_ms: int) -> StorageContext:
        return StorageContext(self.store_key, self.store_num_partitions, ssl_context, timeout_ms)


def _metadata_or_none(client: KazooClient, root: str, partition_id: int) -> PartitionMetadata | None:
    try:
        found = store_metadata.read_partition_metadata(client, root, partition_id)
    except WaltzError:
        return None
    return None if found.version == NO_VERSION else found.metadata


def read_cluster_view(client: KazooClient, root: str) -> ClusterView:
    num_partitions = read_cluster_params(client, root).num_partitions
    params = store_metadata.read_store_params(client, root)
    return ClusterView(
        num_partitions,
        read_partition_assignment(client, root),
        read_server_descriptors(client, root),
        params.key,
        params.num_partitions,
        store_metadata.read_replica_assignments(client, root).as_dict(),
        store_metadata.read_connection_metadata(client, root).as_dict(),
        {p: _metadata_or_none(client, root, p) for p in range(num_partitions)},
    )


def _endpoint(descriptor: ServerDescriptor) -> HostPort:
    return HostPort(descriptor.host, descriptor.port)


# --- check-connectivity ------------------------------------------------------------------------


class ServerConnectivity(NamedTuple):
    server_id: int
    endpoint: str
    storages: dict[str, bool] | None  # None: the server did not answer (UNREACHABLE)
    error: str | None

    def line(self) -> str:
        """The original's output line."""
        status = "UNREACHABLE" if self.storages is None else java_bool_map(self.storages)
        return f"Connectivity status of {self.endpoint} is: {status}"

    def to_json(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "endpoint": self.endpoint,
            "reachable": self.storages is not None,
            "storages": self.storages,
            "error": self.error,
        }


async def check_connectivity(
    view: ClusterView, ssl_context: ssl.SSLContext, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> list[ServerConnectivity]:
    """Message 13 to every live server: can it open every storage node of the assignment?"""

    async def ask(descriptor: ServerDescriptor) -> ServerConnectivity:
        try:
            async with ServerRpcClient(_endpoint(descriptor), ssl_context, timeout_ms=timeout_ms) as rpc:
                storages = await rpc.check_storage_connectivity()
        except ServerRpcError as e:
            return ServerConnectivity(descriptor.server_id, descriptor.endpoint, None, str(e))
        return ServerConnectivity(descriptor.server_id, descriptor.endpoint, storages, None)

    return list(await asyncio.gather(*(ask(d) for d in view.servers)))


# --- verify -----------------------------------------------------------------------------------


class ValidationType(enum.Enum):
    """The original's ``ValidationResult.ValidationType``, in its order (the output order)."""

    PARTITION_ASSIGNMENT_ZK_VALIDITY = "PARTITION_ASSIGNMENT_ZK_VALIDITY"
    PARTITION_ASSIGNMENT_ZK_SERVER_CONSISTENCY = "PARTITION_ASSIGNMENT_ZK_SERVER_CONSISTENCY"
    SERVER_STORAGE_CONNECTIVITY = "SERVER_STORAGE_CONNECTIVITY"
    PARTITION_ASSIGNMENT_ZK_STORAGE_CONSISTENCY = "PARTITION_ASSIGNMENT_ZK_STORAGE_CONSISTENCY"
    PARTITION_QUORUM_STATUS = "PARTITION_QUORUM_STATUS"
    REPLICA_RECOVERY_STATUS = "REPLICA_RECOVERY_STATUS"
    SERVER_PARTITION_HEALTH_CHECK = "SERVER_PARTITION_HEALTH_CHECK"


NO_SERVER_ENDPOINT = "No Server Endpoint found."  # what a server validation nobody answered gets
CANNOT_OBTAIN_REPLICA_STATES = "Cannot obtain replica states"


class ValidationResult(NamedTuple):
    type: ValidationType
    passed: bool
    error: str  # exactly as the original builds it (several errors joined by line separators)

    @property
    def messages(self) -> list[str]:
        return [line for line in self.error.split(LINE_SEPARATOR) if line]

    def to_json(self) -> dict[str, Any]:
        return {"validation": self.type.value, "passed": self.passed, "errors": self.messages}


class PartitionValidation(NamedTuple):
    partition_id: int
    results: tuple[ValidationResult, ...]  # one per ValidationType, in its order

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "passed": self.passed,
            "validations": [r.to_json() for r in self.results],
        }


class VerifyReport(NamedTuple):
    partitions: tuple[PartitionValidation, ...]
    unreachable_storages: dict[str, str]  # storage → why its admin port did not answer

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.partitions)

    def original_text(self) -> list[str]:
        """What the original prints for the failures (before its Passed/Failed banner)."""
        lines = []
        for partition in self.partitions:
            for result in partition.results:
                if not result.passed:
                    lines.append(
                        f"Validation {result.type.value} failed for partition {partition.partition_id}"
                    )
                    indented = result.error.replace(LINE_SEPARATOR, LINE_SEPARATOR + "  ")
                    lines.append(f"  Validation error is: {indented}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "partitions": [p.to_json() for p in self.partitions],
            "unreachable_storages": self.unreachable_storages,
        }


class _ServerAnswers(NamedTuple):
    descriptor: ServerDescriptor
    partitions: list[int] | ServerRpcError
    connectivity: dict[str, bool] | ServerRpcError
    health: dict[int, bool] | ServerRpcError


async def _ask_server(
    descriptor: ServerDescriptor, ssl_context: ssl.SSLContext, timeout_ms: int
) -> _ServerAnswers:
    """Messages 15, 13 and 21 on one connection; each answer or its error."""
    rpc = ServerRpcClient(_endpoint(descriptor), ssl_context, timeout_ms=timeout_ms)
    try:
        await rpc.open()
    except ServerRpcError as e:
        return _ServerAnswers(descriptor, e, e, e)

    async def ask(call: Callable[[], Awaitable[T]]) -> T | ServerRpcError:
        try:
            if rpc.closed:  # a timed-out answer drops the connection: the next request reconnects
                await rpc.open()
            return await call()
        except ServerRpcError as e:
            return e

    try:
        partitions = await ask(rpc.server_partitions)
        connectivity = await ask(rpc.check_storage_connectivity)
        health = await ask(rpc.partitions_health)
    finally:
        await rpc.close()
    return _ServerAnswers(descriptor, partitions, connectivity, health)


async def _storage_statuses(
    view: ClusterView, context: StorageContext
) -> tuple[dict[int, dict[str, bool]], dict[str, str]]:
    """Admin ASSIGNED_PARTITION_STATUS of every storage in store/connection: partition →
    storage → assigned-and-available, and the storages that did not answer (skipped, as the
    original does)."""

    async def ask(storage: str, admin_port: int) -> tuple[str, dict[int, bool] | str]:
        try:
            host = parse_host_port(storage).host
        except WaltzError as e:
            return storage, str(e)
        address = HostPort(host, admin_port)
        try:
            async with admin_ops.admin_client(context, address) as admin:
                return storage, await asyncio.wait_for(
                    admin.assigned_partition_status(), context.timeout_ms / 1000
                )
        except (StorageAdminError, TimeoutError, WaltzError, OSError) as e:
            return storage, str(e) or f"no answer from {address} within {context.timeout_ms} ms"

    answers = await asyncio.gather(*(ask(s, p) for s, p in sorted(view.storage_admin_ports.items())))
    statuses: dict[int, dict[str, bool]] = {}
    unreachable: dict[str, str] = {}
    for storage, answer in answers:
        if isinstance(answer, str):
            unreachable[storage] = answer
            continue
        for partition_id, status in answer.items():
            statuses.setdefault(partition_id, {})[storage] = status
    return statuses, unreachable


class _Results:
    """Per partition and validation type: the first result set wins, as the original's map puts
    are (re)written in step order and missing ones are filled in at the end."""

    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = num_partitions
        self.by_partition: list[dict[ValidationType, ValidationResult]] = [{} for _ in range(num_partitions)]

    def put(self, partition_id: int, kind: ValidationType, error: str) -> None:
        # A server may report a partition the cluster does not have; the original would crash
        # (index out of bounds) — here it is not any partition's result.
        if 0 <= partition_id < self.num_partitions:
            self.by_partition[partition_id][kind] = ValidationResult(kind, error == "", error)

    def get(self, partition_id: int, kind: ValidationType) -> ValidationResult | None:
        return self.by_partition[partition_id].get(kind)

    def fail_missing(self, kind: ValidationType, error: str) -> None:
        for results in self.by_partition:
            results.setdefault(kind, ValidationResult(kind, False, error))

    def report(self, unreachable: dict[str, str]) -> VerifyReport:
        partitions = tuple(
            PartitionValidation(p, tuple(results[kind] for kind in ValidationType))
            for p, results in enumerate(self.by_partition)
        )
        return VerifyReport(partitions, unreachable)


def _zk_validity(view: ClusterView, results: _Results) -> None:
    owner = [NO_SERVER] * view.num_partitions
    for server in view.assignment.servers:
        for info in server.partitions:
            p = info.partition_id
            if not 0 <= p < view.num_partitions:
                error = f"Error: Server {server.server_id} handles invalid partition {p}"
            elif owner[p] != NO_SERVER:
                error = f"Error: Partition handled by more than one server: {owner[p]} and {server.server_id}"
            else:
                owner[p] = server.server_id
                error = ""
            results.put(p, ValidationType.PARTITION_ASSIGNMENT_ZK_VALIDITY, error)
    for p in range(view.num_partitions):
        if owner[p] == NO_SERVER:
            results.put(
                p,
                ValidationType.PARTITION_ASSIGNMENT_ZK_VALIDITY,
                f"Error: Partition {p} not handled by any server",
            )


def _zk_server_consistency(view: ClusterView, answers: _ServerAnswers, results: _Results) -> None:
    kind = ValidationType.PARTITION_ASSIGNMENT_ZK_SERVER_CONSISTENCY
    in_zk = view.partitions_of(answers.descriptor.server_id)
    if isinstance(answers.partitions, ServerRpcError):
        for p in in_zk:
            results.put(p, kind, str(answers.partitions))
        return
    match = dict.fromkeys(in_zk, "ONLY_IN_ZOOKEEPER")
    for p in answers.partitions:
        match[p] = "IN_BOTH" if p in match else "ONLY_IN_SERVER"
    for p, state in match.items():
        if not 0 <= p < view.num_partitions:
            continue
        validity = results.get(p, ValidationType.PARTITION_ASSIGNMENT_ZK_VALIDITY)
        if validity is not None and not validity.passed:
            error = validity.error
        elif state != "IN_BOTH":
            error = f"Partition {p} not matching in zk and server: {state}"
        else:
            error = ""
        results.put(p, kind, error)


def _server_storage_connectivity(view: ClusterView, answers: _ServerAnswers, results: _Results) -> None:
    prefix = f"Server {answers.descriptor.endpoint}"
    statuses = answers.connectivity
    for p in view.partitions_of(answers.descriptor.server_id):
        if isinstance(statuses, ServerRpcError):
            error = f"{prefix}, no connectivity statuses response"
        else:
            error = ""
            for storage in sorted(view.replicas_of(p)):
                if storage not in statuses:
                    error += (
                        LINE_SEPARATOR
                        + f"{prefix}, storage replica {storage} missing in connectivity statuses"
                    )
                elif not statuses[storage]:
                    failed = f"{prefix}, storage connectivity check for storage replica {storage} failed"
                    error += LINE_SEPARATOR + failed
        results.put(p, ValidationType.SERVER_STORAGE_CONNECTIVITY, error)


def _partition_health(view: ClusterView, answers: _ServerAnswers, results: _Results) -> None:
    kind = ValidationType.SERVER_PARTITION_HEALTH_CHECK
    if isinstance(answers.health, ServerRpcError):
        for p in view.partitions_of(answers.descriptor.server_id):
            results.put(p, kind, str(answers.health))
        return
    for p, healthy in answers.health.items():
        error = (
            ""
            if healthy
            else f"Partition {p} belonging to server {answers.descriptor.endpoint} is not healthy"
        )
        results.put(p, kind, error)


def _storage_consistency_and_quorum(
    view: ClusterView, statuses: dict[int, dict[str, bool]], results: _Results
) -> None:
    for p in range(view.num_partitions):
        found = statuses.get(p, {})
        consistent = view.replicas_of(p) == set(found)
        results.put(
            p,
            ValidationType.PARTITION_ASSIGNMENT_ZK_STORAGE_CONSISTENCY,
            "" if consistent else "Error: ZooKeeper and StorageNode Partition Assignment mismatch",
        )
        # The original counts against every storage node of the cluster, not the partition's.
        available = sum(1 for ok in found.values() if ok)
        quorum = available > len(view.storage_admin_ports) // 2
        results.put(
            p, ValidationType.PARTITION_QUORUM_STATUS, "" if quorum else "Error: Quorum is not achieved"
        )


def _replica_recovery(view: ClusterView, results: _Results) -> None:
    for p in range(view.num_partitions):
        expected = view.replicas_of(p)
        metadata = view.partition_metadata.get(p)
        error = CANNOT_OBTAIN_REPLICA_STATES if metadata is None else ""
        for state in metadata.replica_states if metadata is not None else ():
            storage = state.replica_id.storage
            if storage not in expected:
                error += f"{LINE_SEPARATOR}Storage {storage} replica info missing in replica assignments"
                continue
            expected.discard(storage)
            complete = (
                metadata is not None and state.session_id == metadata.session_id and state.is_unresolved
            )
            if not complete:
                error += f"{LINE_SEPARATOR}Storage {storage} recovery not completed"
        for storage in sorted(expected):
            error += f"{LINE_SEPARATOR}Storage {storage} replica info missing in replica states"
        results.put(p, ValidationType.REPLICA_RECOVERY_STATUS, error)


async def verify(
    view: ClusterView, ssl_context: ssl.SSLContext, timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
) -> VerifyReport:
    """The original's seven validations for every partition (``ClusterCli verify``).

    Servers and storage nodes are asked concurrently; each request is bounded by
    ``timeout_s``. A server validation no live server answered for fails with the original's
    "No Server Endpoint found.".
    """
    if timeout_s <= 0:
        raise ClusterOpsError(f"timeout must be positive, got {timeout_s} s")
    timeout_ms = max(1, int(timeout_s * 1000))
    results = _Results(view.num_partitions)
    _zk_validity(view, results)
    server_answers, (statuses, unreachable) = await asyncio.gather(
        asyncio.gather(*(_ask_server(d, ssl_context, timeout_ms) for d in view.servers)),
        _storage_statuses(view, view.storage_context(ssl_context, timeout_ms)),
    )
    for answers in server_answers:
        _zk_server_consistency(view, answers, results)
        _server_storage_connectivity(view, answers, results)
    _storage_consistency_and_quorum(view, statuses, results)
    for answers in server_answers:
        _partition_health(view, answers, results)
    _replica_recovery(view, results)
    for kind in (
        ValidationType.PARTITION_ASSIGNMENT_ZK_SERVER_CONSISTENCY,
        ValidationType.SERVER_STORAGE_CONNECTIVITY,
        ValidationType.SERVER_PARTITION_HEALTH_CHECK,
    ):
        results.fail_missing(kind, NO_SERVER_ENDPOINT)
    return results.report(unreachable)


def check_verify_partition(view: ClusterView, partition_id: int | None) -> None:
    if partition_id is not None and not 0 <= partition_id < view.num_partitions:
        raise ClusterOpsError(f"Failed to verify cluster. Partition {partition_id} is not valid.")


# --- server list (HTTP /metrics) -----------------------------------------------------------------


class ServerPartitionList(NamedTuple):
    endpoint: str
    num_partitions: int
    replicas: dict[int, list[str]]  # partition → storage connect strings

    def lines(self) -> list[str]:
        """The original ``ServerCli list`` output."""
        lines = [f"There are {self.num_partitions} partitions for current server"]
        lines += [f"Storage node for partition {p}: {java_list(s)}" for p, s in sorted(self.replicas.items())]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.endpoint,
            "num_partitions": self.num_partitions,
            "partitions": [{"partition": p, "storage_nodes": s} for p, s in sorted(self.replicas.items())],
        }


def server_list(endpoint: HostPort, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ServerPartitionList:
    """The partitions a server holds and their storage nodes, from its ``/metrics`` gauges."""
    url = f"http://{endpoint}{METRICS_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_ms / 1000) as response:  # noqa: S310 (http only)
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ClusterOpsError(f"Cannot read metrics of server {endpoint} ({url}): {reason}") from None
    gauges = body.get("gauges") if isinstance(body, dict) else None
    if not isinstance(gauges, dict):
        raise ClusterOpsError(f"{url} has no gauges: is {endpoint} a Waltz server's jetty port?")
    count = (gauges.get(GAUGE_NUM_PARTITIONS) or {}).get("value")
    info = (gauges.get(GAUGE_REPLICA_INFO) or {}).get("value")
    if not isinstance(count, int) or not isinstance(info, dict):
        raise ClusterOpsError(
            f"{url} lacks {GAUGE_NUM_PARTITIONS} or {GAUGE_REPLICA_INFO}: not a Waltz server?"
        )
    try:
        replicas = {int(p): [str(s) for s in storages] for p, storages in info.items()}
    except (TypeError, ValueError):
        raise ClusterOpsError(f"{url}: {GAUGE_REPLICA_INFO} is not partition → storage nodes") from None
    return ServerPartitionList(str(endpoint), count, replicas)


# --- preferred partitions --------------------------------------------------------------------------


async def add_preferred_partitions(
    endpoint: HostPort,
    partition_ids: Sequence[int],
    ssl_context: ssl.SSLContext,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> None:
    """Message 17; the server's refusal is the original's error message."""
    async with ServerRpcClient(endpoint, ssl_context, timeout_ms=timeout_ms) as rpc:
        accepted = await rpc.add_preferred_partitions(partition_ids)
    if not accepted:
        raise ClusterOpsError(
            f"Failed to add preferred partition(s) {java_list(partition_ids)} to server Endpoint {endpoint}."
        )


async def remove_preferred_partitions(
    endpoint: HostPort,
    partition_ids: Sequence[int],
    ssl_context: ssl.SSLContext,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> None:
    """Message 19; the server's refusal is the original's error message."""
    async with ServerRpcClient(endpoint, ssl_context, timeout_ms=timeout_ms) as rpc:
        accepted = await rpc.remove_preferred_partitions(partition_ids)
    if not accepted:
        raise ClusterOpsError(
            f"Failed to remove preferred partition {java_list(partition_ids)} "
            f"from server Endpoint {endpoint}."
        )


# --- forced assignment (the original's issue #6) --------------------------------------------------


class ForcedAssignment(NamedTuple):
    partition_id: int
    server_id: int | None  # None: handed back to the assignment policy
    endpoint: str | None
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "server_id": self.server_id,
            "endpoint": self.endpoint,
            "changed": self.changed,
        }


def _check_partition_in_cluster(client: KazooClient, root: str, partition_id: int) -> None:
    num_partitions = read_cluster_params(client, root).num_partitions
    if not 0 <= partition_id < num_partitions:
        raise ClusterOpsError(
            f"Partition {partition_id} does not belong to the cluster (partitions 0-{num_partitions - 1})"
        )


def live_server(client: KazooClient, root: str, server_id: int) -> ServerDescriptor:
    """The descriptor of a live server (registered in ZooKeeper) by its id."""
    live = {d.server_id: d for d in read_server_descriptors(client, root)}
    if server_id not in live:
        ids = ", ".join(str(s) for s in sorted(live)) or "none"
        raise ClusterOpsError(
            f"Server {server_id} is not a live server of the cluster (live server ids: {ids})"
        )
    return live[server_id]


def server_endpoint(client: KazooClient, root: str, server_id: int) -> HostPort:
    """Where a live server takes clients (its client port), by its id."""
    return _endpoint(live_server(client, root, server_id))


def assign_partition(client: KazooClient, root: str, partition_id: int, server_id: int) -> ForcedAssignment:
    """Pin a partition to a live server; the coordinator moves it (new generation) at once."""
    _check_partition_in_cluster(client, root, partition_id)
    descriptor = live_server(client, root, server_id)
    changed = force_assign(client, root, partition_id, server_id)
    return ForcedAssignment(partition_id, server_id, descriptor.endpoint, changed)


def unassign_partition(client: KazooClient, root: str, partition_id: int) -> ForcedAssignment:
    """Hand a forced partition back to the assignment policy (``changed`` False if it was not forced)."""
    _check_partition_in_cluster(client, root, partition_id)
    changed = force_unassign(client, root, partition_id)
    return ForcedAssignment(partition_id, None, None, changed)


def forced_assignments(client: KazooClient, root: str) -> dict[int, int]:
    return read_forced_assignments(client, root)


# --- truncate (offline) ------------------------------------------------------------------------------


class TruncateResult(NamedTuple):
    partition_id: int
    storage: str  # host:data_port
    session_id: int
    low_water_mark: int
    old_max_transaction_id: int
    new_max_transaction_id: int
    forced: bool

    @property
    def removed(self) -> int:
        return self.old_max_transaction_id - self.new_max_transaction_id

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "storage": self.storage,
            "session_id": self.session_id,
            "low_water_mark": self.low_water_mark,
            "old_max_transaction_id": self.old_max_transaction_id,
            "new_max_transaction_id": self.new_max_transaction_id,
            "removed": self.removed,
            "forced": self.forced,
        }


async def truncate_partition(
    context: StorageContext,
    admin_address: HostPort,
    data_port: int,
    partition_id: int,
    to_transaction_id: int,
    *,
    force: bool = False,
) -> TruncateResult:
    """Cut a replica's tail after ``to_transaction_id``, offline (the partition must be
    unavailable on the node), never below its low-water mark unless ``force``.

    Uses a data-port client in offline-recovery mode with the node's last session id, as the
    original's offline recovery does; TRUNCATE answers the new max transaction id.
    """
    context.check_partitions([partition_id])
    if to_transaction_id < NO_TRANSACTION:
        raise ClusterOpsError(
            f"--to must be {NO_TRANSACTION} (empty) or a transaction id, got {to_transaction_id}"
        )
    data_address = HostPort(admin_address.host, data_port)
    fail = f"Failed to truncate partition {partition_id} on {data_address}"
    try:
        async with admin_ops.admin_client(context, admin_address) as admin:
            status = await admin.assigned_partition_status()
            info = await admin.last_session_info(partition_id)
        if partition_id not in status:
            raise ClusterOpsError(f"{fail}: the partition is not assigned to that storage node")
        if status[partition_id]:
            raise ClusterOpsError(
                f"{fail}: the partition is available (online) there; make it unavailable first: "
                f"waltz storage availability -s {admin_address} -p {partition_id} --offline"
            )
        if to_transaction_id < info.low_water_mark and not force:
            raise ClusterOpsError(
                f"{fail}: {to_transaction_id} is below the replica's low-water mark {info.low_water_mark} "
                f"(transactions up to it were committed); use --force to cut anyway"
            )
        async with admin_ops.data_client(context, data_address, used_by_offline_recovery=True) as data:
            old_max = await data.max_transaction_id(info.session_id, partition_id)
            new_max = await data.truncate(info.session_id, partition_id, to_transaction_id)
    except (StorageAdminError, ClusterOpsError):
        raise
    except (WaltzError, OSError, TimeoutError) as e:
        raise ClusterOpsError(f"{fail}: {str(e) or type(e).__name__}") from None
    assert new_max <= old_max, "TRUNCATE never adds transactions"
    return TruncateResult(
        partition_id, str(data_address), info.session_id, info.low_water_mark, old_max, new_max, force
    )


# --- recover (a store session from this process) -----------------------------------------------------

DEFAULT_RECOVER_TIMEOUT_S = 60.0
# After the session opens (a quorum recovered), the other reachable replicas finish recovery in
# the background; polled this often, until all did or the timeout.
REPLICA_POLL_INTERVAL_S = 0.05


def _all_replicas_recovered(status: dict[str, Any]) -> bool:
    session = status.get("session")
    replicas = session.get("replicas", []) if isinstance(session, dict) else []
    return all(r.get("max_transaction_id") is not None for r in replicas)


async def _wait_for_replicas(partition: Any, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    while not _all_replicas_recovered(partition.status()) and loop.time() < deadline:
        await asyncio.sleep(REPLICA_POLL_INTERVAL_S)


class RecoverResult(NamedTuple):
    partition_id: int
    generation: int
    session_id: int | None
    high_water_mark: int
    status: dict[str, Any]  # StorePartition.status(): the session and each replica's state

    @property
    def replicas(self) -> list[dict[str, Any]]:
        session = self.status.get("session")
        return list(session.get("replicas", [])) if isinstance(session, dict) else []

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "generation": self.generation,
            "session_id": self.session_id,
            "high_water_mark": self.high_water_mark,
            "status": self.status,
        }


async def recover_partition(
    client: KazooClient,
    root: str,
    partition_id: int,
    ssl_context: ssl.SSLContext,
    *,
    timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S,
) -> RecoverResult:
    """Open a new store session for a partition in this process, which runs recovery now.

    The session takes the partition's current generation from ``store/partition/<P>`` and the
    next session id, so the owning server's session is fenced: the server opens a new one
    (running recovery again) on its next use. Returns the resolved high-water mark and each
    replica's state; the session is closed before returning.
    """
    # Imported here: the store layer is large and only this operation needs it.
    from waltz_engine.server.store import Store, StoreConfig, StoreError

    if timeout_s <= 0:
        raise ClusterOpsError(f"timeout must be positive, got {timeout_s} s")
    _check_partition_in_cluster(client, root, partition_id)
    generation = store_metadata.read_partition_metadata(client, root, partition_id).metadata.generation
    store = Store(client, root, ssl_context, StoreConfig())
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        await store.start()
        partition = store.partition(partition_id)
        await partition.set_generation(generation)
        try:
            await asyncio.wait_for(partition.ensure_open(), timeout_s)
        except TimeoutError:
            raise ClusterOpsError(
                f"Recovery of partition {partition_id} did not finish within {timeout_s:g} s "
                f"(a quorum of its replicas must be reachable): {json.dumps(partition.status(), default=str)}"
            ) from None
        # Closing now would abort the replicas still recovering: give them the time left.
        await _wait_for_replicas(partition, deadline)
        status = dict(partition.status())
        session = status.get("session")
        session_id = session.get("session_id") if isinstance(session, dict) else None
        return RecoverResult(
            partition_id,
            generation,
            session_id if isinstance(session_id, int) else None,
            partition.high_water_mark,
            status,
        )
    except StoreError as e:
        raise ClusterOpsError(f"Recovery of partition {partition_id} failed: {e}") from None
    finally:
        await store.close()
