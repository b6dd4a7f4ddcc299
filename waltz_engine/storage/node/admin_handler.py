"""The admin port (``storage.admin.port``): assignment, availability, status, metrics, raw reads
(reference §1.3). Requests of one connection are served in order; disk work runs on the
node's admin thread, so the event loop and the partitions' threads are never held up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

from waltz_engine.auth.acl import ADMIN, NO_PARTITION, READ
from waltz_engine.auth.authorizer import Authorizer, resource_name
from waltz_engine.common.errors import ProtocolError, StorageError
from waltz_engine.common.json_text import dumps_indented
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.net.channel import FramedConnection
from waltz_engine.storage.node.data_handler import NOT_OPENED_MESSAGE, check_open
from waltz_engine.storage.node.failures import (
    NotAuthorizedError,
    NotOpenedError,
    PartitionNotAssignedError,
    rpc_exception,
)
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.wire.admin_messages import (
    AdminAssignedPartitionStatusRequest,
    AdminAssignedPartitionStatusResponse,
    AdminFailureResponse,
    AdminLastSessionInfoRequest,
    AdminLastSessionInfoResponse,
    AdminMetricsRequest,
    AdminMetricsResponse,
    AdminOpenRequest,
    AdminPartitionAssignmentRequest,
    AdminPartitionAvailableRequest,
    AdminRecordListRequest,
    AdminSuccessResponse,
    record_list_raw_frame,
)
from waltz_engine.wire.primitives import Buffer, SessionInfo

log = logging.getLogger(__name__)
ADMIN_PORT = "storage admin port"
# What each admin request needs (issue 34): reads (Spark, backups, online checksums, movers) and
# writes (assignment, availability: admin).
_READS = (
    AdminRecordListRequest,
    AdminLastSessionInfoRequest,
    AdminMetricsRequest,
    AdminAssignedPartitionStatusRequest,
)

T = TypeVar("T")
# Jackson's pretty printer indents by two spaces.
METRICS_JSON_INDENT = 2


class _RecordListAnswer(NamedTuple):
    """A RECORD_LIST_RESPONSE to send: its record list in the pieces it was read in."""

    seq_num: int
    partition_id: int
    record_list: list[Buffer]


class AdminHandler:
    """``handler(conn)`` for :func:`waltz_engine.net.channel.serve` on the admin port."""

    def __init__(
        self,
        manager: StorageManager,
        metrics: MetricsRegistry,
        executor: ThreadPoolExecutor,
        on_assignment_changed: Callable[[], Awaitable[None]],
        on_taken_offline: Callable[[], Awaitable[object]] | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self._authorizer = authorizer
        self._manager = manager
        self._metrics = metrics
        self._executor = executor
        self._on_assignment_changed = on_assignment_changed
        self._on_taken_offline = on_taken_offline

    async def _off_loop(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    async def __call__(self, conn: FramedConnection) -> None:
        opened = False
        authorizer = self._authorizer
        principal = authorizer.principal_of(conn, ADMIN_PORT) if authorizer is not None else None
        while (msg := await conn.receive()) is not None:
            if type(msg) is AdminOpenRequest:
                error = await check_open(self._manager, msg.key, msg.num_partitions)
                opened = error is None
                if error is not None:
                    log.warning("admin port: OPEN from %s refused: %s", conn.peer, error)
                await conn.send(
                    AdminSuccessResponse(msg.seq_num) if error is None else self._reply(msg, error)
                )
                continue
            if not opened:
                await conn.send(self._reply(msg, NotOpenedError(NOT_OPENED_MESSAGE)))
                raise ProtocolError(f"{type(msg).__name__} before a successful OPEN_REQUEST")
            refusal = self._refusal(authorizer, principal, msg, conn.peer) if authorizer is not None else None
            if refusal is not None:
                await conn.send(self._reply(msg, refusal))
                continue
            try:
                reply = await self._serve(msg)
            # ObjectStoreError: a raw read of a segment evicted to the tier, whose store failed
            # it (a 500): the request fails and the mover asks again; the node goes on serving
            # (it escaped the connection's task, a traceback per refused get in the simulator).
            except (StorageError, OSError, ObjectStoreError) as e:
                log.warning("admin port: %s from %s failed: %s", type(msg).__name__, conn.peer, e)
                reply = self._reply(msg, e)
            if type(reply) is _RecordListAnswer:
                conn.send_frames(record_list_raw_frame(reply.seq_num, reply.partition_id, reply.record_list))
                await conn.drain()
            else:
                await conn.send(reply)

    @staticmethod
    def _refusal(
        authorizer: Authorizer, principal: str | None, msg: Any, peer: str
    ) -> NotAuthorizedError | None:

        kind = type(msg)
        operation = READ if kind in _READS else ADMIN
        if kind in (AdminRecordListRequest, AdminLastSessionInfoRequest):
            partitions: tuple[int, ...] = (msg.partition_id,)
        elif kind in (AdminPartitionAvailableRequest, AdminPartitionAssignmentRequest):
            partitions = tuple(msg.partition_ids or ()) or (NO_PARTITION,)
        else:
            partitions = (NO_PARTITION,)
        name = kind.__name__
        for partition_id in partitions:
            if not authorizer.check(principal, operation, partition_id, name, peer):
                return NotAuthorizedError(principal, operation, resource_name(partition_id), name)
        return None

    @staticmethod
    def _reply(msg: Any, error: BaseException) -> AdminFailureResponse:
        return AdminFailureResponse(msg.seq_num, rpc_exception(error))

    def _partition_ids(self, ids: tuple[int, ...] | None) -> tuple[int, ...]:
        if ids is None:
            raise StorageError("partition id list is null")
        for partition_id in ids:
            if not 0 <= partition_id < self._manager.num_partitions:
                raise StorageError(
                    f"partition id {partition_id} is out of range [0, {self._manager.num_partitions})"
                )
        return ids

    async def _serve(self, msg: Any) -> Any:
        manager = self._manager
        kind = type(msg)
        if kind is AdminPartitionAvailableRequest:
            ids = self._partition_ids(msg.partition_ids)
            await self._off_loop(lambda: manager.set_partition_available(ids, msg.toggled))
            log.info("partitions %s set %s", list(ids), "available" if msg.toggled else "unavailable")
            if not msg.toggled and self._on_taken_offline is not None:
                # An offline copy (a replica move) may need to begin the log at the retained
                # start, which only the current retention bound allows.
                await self._on_taken_offline()
            return AdminSuccessResponse(msg.seq_num)
        if kind is AdminPartitionAssignmentRequest:
            ids = self._partition_ids(msg.partition_ids)
            try:
                await self._off_loop(
                    lambda: manager.set_partition_assignment(ids, msg.toggled, msg.delete_storage_files)
                )
            finally:
                await self._on_assignment_changed()
            log.info(
                "partitions %s %s%s",
                list(ids),
                "assigned" if msg.toggled else "unassigned",
                " (files deleted)" if msg.delete_storage_files and not msg.toggled else "",
            )
            return AdminSuccessResponse(msg.seq_num)
        if kind is AdminRecordListRequest:
            # Served from the segments' bytes (``Partition.records_wire``): the bytes of an
            # AdminRecordListResponse of the same records, without a Record per record.
            # Written as it was read (count, then the chunks), not joined into one buffer.
            records = await self._off_loop(
                lambda: (
                    self._assigned(msg.partition_id)
                    .records_wire(msg.transaction_id, msg.max_num_records)
                    .record_list()
                )
            )
            return _RecordListAnswer(msg.seq_num, msg.partition_id, records)
        if kind is AdminLastSessionInfoRequest:
            info = await self._off_loop(lambda: manager.partition_info(msg.partition_id).last_session_info())
            return AdminLastSessionInfoResponse(msg.seq_num, msg.partition_id, SessionInfo(*info))
        if kind is AdminMetricsRequest:
            return AdminMetricsResponse(
                msg.seq_num, dumps_indented(self._metrics.to_json(), METRICS_JSON_INDENT)
            )
        if kind is AdminAssignedPartitionStatusRequest:
            status = await self._off_loop(manager.assigned_partition_status)
            return AdminAssignedPartitionStatusResponse(msg.seq_num, tuple(sorted(status.items())))
        raise ProtocolError(f"{kind.__name__} is not a request the storage admin port serves")

    def _assigned(self, partition_id: int) -> Any:
        try:
            return self._manager.partition(partition_id)
        except StorageError:
            raise PartitionNotAssignedError(partition_id) from None
