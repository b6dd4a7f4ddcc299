"""``cluster verify``: the original's seven validations per partition (reference §4.5)."""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from waltz_engine.common.address import HostPort, parse_host_port
from waltz_engine.common.errors import WaltzError
from waltz_engine.ops.cluster_ops.view import (
    DEFAULT_VERIFY_TIMEOUT_S,
    LINE_SEPARATOR,
    NO_SERVER,
    ClusterOpsError,
    ClusterView,
    descriptor_endpoint,
)
from waltz_engine.server.rpc_client import ServerRpcClient, ServerRpcError
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import StorageAdminError, StorageContext
from waltz_engine.zk.partition_ranges import not_in_cluster
from waltz_engine.zk.payloads import ServerDescriptor

# --- verify -----------------------------------------------------------------------------------


T = TypeVar("T")


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
    rpc = ServerRpcClient(descriptor_endpoint(descriptor), ssl_context, timeout_ms=timeout_ms)
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
                async with asyncio.timeout(context.timeout_ms / 1000):
                    return storage, await admin.assigned_partition_status()
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
        raise ClusterOpsError(
            f"Failed to verify cluster. {not_in_cluster([partition_id], view.num_partitions)}"
        )
