"""The storage node's admin-port client (``storage.admin.port``): its calls over the storage
client's RPC connection."""

from __future__ import annotations

import json
import logging
import ssl
import uuid
from collections.abc import Sequence
from typing import Any

from waltz_engine.common.record import Record
from waltz_engine.net.channel import (
    CONNECT_TIMEOUT_MS,
)
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.storage.client import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    StorageRpcError,
    _RpcConnection,
)
from waltz_engine.storage.eager_calls import OPEN_SEQ_NUM
from waltz_engine.wire.admin_messages import (
    ADMIN_CODEC,
    ADMIN_RAW_RECORDS_CODEC,
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
    AdminRecordListRawResponse,
    AdminRecordListRequest,
    AdminRecordListResponse,
    AdminSuccessResponse,
)
from waltz_engine.wire.hello import STORAGE_ADMIN_CLIENT_HELLO_TEXT
from waltz_engine.wire.primitives import SessionInfo

log = logging.getLogger(__name__)


class StorageAdminClient(_RpcConnection):
    """A connection to a storage node's admin port (``storage.admin.port``)."""

    def __init__(
        self,
        host: str,
        admin_port: int,
        ssl_context: ssl.SSLContext | None,
        key: uuid.UUID,
        num_partitions: int,
        *,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        raw_records: bool = False,
        network: Network = ASYNCIO_NETWORK,
    ) -> None:
        # raw_records: RECORD_LIST answers stay bytes (record_list_raw), record_list is refused.
        super().__init__(
            "storage admin",
            host,
            admin_port,
            ssl_context,
            ADMIN_RAW_RECORDS_CODEC if raw_records else ADMIN_CODEC,
            STORAGE_ADMIN_CLIENT_HELLO_TEXT,
            request_timeout_ms,
            network,
        )
        self.key = key
        self.num_partitions = num_partitions

    async def open(self, timeout_ms: int = CONNECT_TIMEOUT_MS) -> None:
        request = AdminOpenRequest(OPEN_SEQ_NUM, self.key, self.num_partitions)
        await self._open(ADMIN_CODEC.encode_frame(request), timeout_ms)

    def _is_success(self, response: Any) -> bool:
        return type(response) is AdminSuccessResponse

    def _failure_message(self, response: Any) -> str | None:
        if type(response) is AdminFailureResponse:
            return response.exception.message or "storage node failure (no message)"
        return None

    async def set_partition_available(self, partition_ids: Sequence[int], available: bool) -> None:
        ids = tuple(partition_ids)
        await self._call(lambda s: AdminPartitionAvailableRequest(s, ids, available), AdminSuccessResponse)

    async def set_partition_assignment(
        self, partition_ids: Sequence[int], assigned: bool, delete_storage_files: bool
    ) -> None:
        ids = tuple(partition_ids)
        await self._call(
            lambda s: AdminPartitionAssignmentRequest(s, ids, assigned, delete_storage_files),
            AdminSuccessResponse,
        )

    async def metrics(self) -> dict[str, Any]:
        response = await self._call(AdminMetricsRequest, AdminMetricsResponse)
        if response.metrics_json is None:
            raise StorageRpcError(f"storage admin {self.endpoint}: METRICS_RESPONSE without metrics")
        try:
            metrics: dict[str, Any] = json.loads(response.metrics_json)
        except ValueError as e:
            raise StorageRpcError(f"storage admin {self.endpoint}: metrics are not JSON: {e}") from None
        return metrics

    async def record_list(self, partition_id: int, transaction_id: int, max_records: int) -> list[Record]:
        response = await self._call(
            lambda s: AdminRecordListRequest(s, partition_id, transaction_id, max_records),
            AdminRecordListResponse,
        )
        return list(response.records)

    async def record_list_raw(self, partition_id: int, transaction_id: int, max_records: int) -> memoryview:
        """RECORD_LIST as its answer's bytes: an int32 count, then the records as on the wire
        (needs ``raw_records=True``)."""
        response = await self._call(
            lambda s: AdminRecordListRequest(s, partition_id, transaction_id, max_records),
            AdminRecordListRawResponse,
        )
        return response.records

    async def assigned_partition_status(self) -> dict[int, bool]:
        response = await self._call(AdminAssignedPartitionStatusRequest, AdminAssignedPartitionStatusResponse)
        return dict(response.partition_status_map)

    async def last_session_info(self, partition_id: int) -> SessionInfo:
        response = await self._call(
            lambda s: AdminLastSessionInfoRequest(s, partition_id), AdminLastSessionInfoResponse
        )
        return response.last_session_info
