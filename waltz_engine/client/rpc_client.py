"""Request/response calls on their own connections (the original's ``InternalRpcClient``, §3.6).

Transaction data and high-water marks are asked of whichever server owns the partition;
pending requests are sent again when the partition lands on a new connection, and every wait
is bounded by ``rpc_timeout_ms``. Admin-ish calls go to a named server.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any, TypeVar

from waltz_engine.client.backoff import RECONNECT_BACKOFF_MAX_MS
from waltz_engine.client.base_client import BaseClient
from waltz_engine.client.data_prefetch import DataPrefetch
from waltz_engine.client.errors import (
    AuthorizationError,
    ClientClosedError,
    ClientTimeoutError,
    ClientTlsRefusedError,
    DataChecksumError,
    RpcError,
)
from waltz_engine.client.network_client import Endpoint, NetworkClient, OpenChannel
from waltz_engine.client.partition import next_seq_num
from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import (
    AUTHORIZING_CLIENT_CODEC,
    AddPreferredPartitionRequest,
    AddPreferredPartitionResponse,
    AuthorizationFailure,
    CheckStorageConnectivityRequest,
    CheckStorageConnectivityResponse,
    ClientMessage,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    RemovePreferredPartitionRequest,
    RemovePreferredPartitionResponse,
    ServerPartitionsAssignmentRequest,
    ServerPartitionsAssignmentResponse,
    ServerPartitionsHealthStatRequest,
    ServerPartitionsHealthStatResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)

log = logging.getLogger(__name__)

MAX_DATA_ATTEMPTS = 5  # checksum failures tolerated per fetch (the original's MAX_DATA_ATTEMPTS)
# Transaction.getTransactionData's backoff after an error answer (a partition moving between servers).
DATA_RETRY_INITIAL_MS = 10
DATA_RETRY_MAX_MS = 5_000

R = TypeVar("R")
_REQUEST_TYPES: dict[int, type[Any]] = {spec.type_code: spec.cls for spec in AUTHORIZING_CLIENT_CODEC.specs}

_ADMIN_RESPONSES: dict[type[Any], type[Any]] = {
    CheckStorageConnectivityRequest: CheckStorageConnectivityResponse,
    ServerPartitionsAssignmentRequest: ServerPartitionsAssignmentResponse,
    ServerPartitionsHealthStatRequest: ServerPartitionsHealthStatResponse,
    AddPreferredPartitionRequest: AddPreferredPartitionResponse,
    RemovePreferredPartitionRequest: RemovePreferredPartitionResponse,
}


class _DataFuture:
    __slots__ = ("future", "attempts")

    def __init__(self, attempts: int) -> None:
        self.future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.attempts = attempts


class _RpcPartition:
    __slots__ = ("partition_id", "seq_num", "data", "high_water_mark", "prefetch")

    def __init__(self, partition_id: int, prefetch_bytes: int) -> None:
        self.partition_id = partition_id
        self.seq_num = 0
        self.data: dict[int, _DataFuture] = {}
        self.high_water_mark: asyncio.Future[int] | None = None
        self.prefetch = DataPrefetch(prefetch_bytes) if prefetch_bytes > 0 else None

    def take_waiting(self) -> list[asyncio.Future[Any]]:
        """The futures of every call waiting on this partition's server, forgotten here."""
        futures: list[asyncio.Future[Any]] = [p.future for p in self.data.values()]
        if self.high_water_mark is not None:
            futures.append(self.high_water_mark)
        self.data.clear()
        self.high_water_mark = None
        return futures


class RpcClient(BaseClient):
    def __init__(
        self,
        client_id: int,
        num_partitions: int,
        open_channel: OpenChannel,
        reconnect_delay_ms: int,
        rpc_timeout_ms: int,
        reconnect_max_delay_ms: int = RECONNECT_BACKOFF_MAX_MS,
        data_prefetch_bytes: int = 0,
    ) -> None:
        super().__init__(open_channel, reconnect_delay_ms, reconnect_max_delay_ms)
        self.client_id = client_id
        self.rpc_timeout_ms = rpc_timeout_ms
        self._partitions = {p: _RpcPartition(p, data_prefetch_bytes) for p in range(num_partitions)}
        self._admin: dict[tuple[Endpoint, type[Any]], deque[asyncio.Future[Any]]] = {}

    def _req_id(self, partition: _RpcPartition) -> ReqId:
        partition.seq_num = next_seq_num(partition.seq_num)
        return ReqId(
            self.client_id, self.generation(partition.partition_id), partition.partition_id, partition.seq_num
        )

    def _send(self, partition: _RpcPartition, message: ClientMessage) -> None:
        network_client = self.network_client_of(partition.partition_id)
        if network_client is None or not network_client.send(message):
            log.debug(
                "partition %d: not connected; request goes out on the next mount", partition.partition_id
            )

    # -- BaseClient hooks ------------------------------------------------------------------

    def _on_assigned(self, partition_id: int, network_client: NetworkClient | None) -> None:
        pass  # nothing is mounted on RPC connections; pending requests go out when connected

    def _on_mountable(self, network_client: NetworkClient, partition_id: int) -> None:
        partition = self._partitions[partition_id]
        for transaction_id in partition.data:
            network_client.send(TransactionDataRequest(self._req_id(partition), transaction_id))
        if partition.high_water_mark is not None:
            network_client.send(HighWaterMarkRequest(self._req_id(partition)))

    def on_refused(self, network_client: NetworkClient, error: ClientTlsRefusedError) -> None:
        """Fail every call waiting on ``network_client``'s server: it will not answer this client."""
        for partition in self._partitions.values():
            if self.network_client_of(partition.partition_id) is not network_client:
                continue
            _fail(partition.take_waiting(), error)
        for (endpoint, _), waiters in self._admin.items():
            if endpoint == network_client.endpoint:
                _fail(list(waiters), error)
                waiters.clear()

    def _authorization_failure(self, network_client: NetworkClient, message: AuthorizationFailure) -> None:
        """Our v5: the server's ACLs refused a call; its waiters fail with AuthorizationError."""
        request_type = _REQUEST_TYPES.get(message.request_type)
        name = request_type.__name__ if request_type is not None else f"request type {message.request_type}"
        error = AuthorizationError(message.operation or "?", message.partition_id, message.principal, name)
        log.info("%s", error)
        partition = self._partitions.get(message.req_id.partition_id)
        if request_type is TransactionDataRequest and partition is not None:
            # Every data request of the partition is refused alike: fail them together.
            futures: list[asyncio.Future[Any]] = [p.future for p in partition.data.values()]
            partition.data.clear()
            _fail(futures, error)
        elif request_type is HighWaterMarkRequest and partition is not None:
            if partition.high_water_mark is not None:
                _fail([partition.high_water_mark], error)
                partition.high_water_mark = None
        elif request_type in _ADMIN_RESPONSES:
            waiters = self._admin.get((network_client.endpoint, _ADMIN_RESPONSES[request_type]))
            if waiters:
                _fail([waiters.popleft()], error)

    async def on_message(self, network_client: NetworkClient, message: ClientMessage) -> None:
        self.connection_proved(network_client)
        if isinstance(message, AuthorizationFailure):
            self._authorization_failure(network_client, message)
        elif isinstance(message, TransactionDataResponse):
            self._data_received(message)
        elif isinstance(message, HighWaterMarkResponse):
            partition = self._partitions.get(message.req_id.partition_id)
            future = partition.high_water_mark if partition is not None else None
            if partition is not None and future is not None:
                partition.high_water_mark = None
                if not future.done():
                    future.set_result(message.transaction_id)
        else:
            waiters = self._admin.get((network_client.endpoint, type(message)))
            if waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(message)
            else:
                log.warning(
                    "unexpected message on an RPC connection to %s: %s", network_client.endpoint, message
                )

    # -- transaction data ------------------------------------------------------------------

    def feed_seen(self, partition_id: int, applied_through: int, last_transaction_id: int) -> None:
        """The feed delivered transactions up to ``last_transaction_id``: ask for their data ahead."""
        partition = self._partitions.get(partition_id)
        if partition is not None and partition.prefetch is not None and not self._closed:
            prefetch = partition.prefetch
            prefetch.feed_seen(applied_through, last_transaction_id)
            if prefetch.reading:  # else nothing is wanted (an application that reads no data)
                self._prefetch(partition, prefetch)

    def reset_prefetch(self, partition_id: int) -> None:
        """A remount: the window starts again from what the new feed delivers."""
        partition = self._partitions.get(partition_id)
        if partition is not None and partition.prefetch is not None:
            partition.prefetch.reset()  # their answers still come, and are let go of

    def prefetch_depth(self, partition_id: int) -> int:
        """Transactions whose data is asked for ahead and not yet taken by ``data()``."""
        partition = self._partitions.get(partition_id)
        return partition.prefetch.depth if partition is not None and partition.prefetch is not None else 0

    def _prefetch(self, partition: _RpcPartition, prefetch: DataPrefetch) -> None:
        wanted = prefetch.wanted()
        if not wanted:
            return
        data = partition.data
        network_client = self.network_client_of(partition.partition_id)
        for transaction_id in wanted:
            pending = data.get(transaction_id)
            if pending is None:
                pending = data[transaction_id] = _DataFuture(1)
                # Queued: all asked in this turn of the loop leave in one write. Not connected:
                # they go out on the next mount, as any pending request.
                if network_client is not None:
                    network_client.send(TransactionDataRequest(self._req_id(partition), transaction_id))
            prefetch.requested(transaction_id, pending.future)

    async def get_transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        """The data of one transaction; retries error answers with backoff until the RPC timeout."""
        future: asyncio.Future[bytes] | None = None
        partition = self._partitions.get(partition_id)
        if partition is not None and partition.prefetch is not None and not self._closed:
            future = partition.prefetch.take(transaction_id)
            self._prefetch(partition, partition.prefetch)
            if future is not None and future.done() and not future.cancelled():
                if future.exception() is None:
                    return future.result()  # asked ahead and answered: no wait at all
                future = None  # an error answer: asked again below, as any other
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.rpc_timeout_ms / 1000
        backoff_ms = DATA_RETRY_INITIAL_MS
        while True:
            try:
                if future is None:
                    future = self._data_future(partition_id, transaction_id)
                return await self._await(future, deadline, "transaction data")
            except RpcError as e:
                future = None
                if loop.time() + backoff_ms / 1000 >= deadline:
                    raise ClientTimeoutError(
                        f"no data for transaction {transaction_id} of partition {partition_id} within "
                        f"{self.rpc_timeout_ms} ms; last error: {e}"
                    ) from None
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, DATA_RETRY_MAX_MS)

    def _data_future(
        self, partition_id: int, transaction_id: int, attempts: int = 1
    ) -> asyncio.Future[bytes]:
        self._check_open()
        partition = self._partitions[partition_id]
        pending = partition.data.get(transaction_id)
        if pending is None:
            pending = partition.data[transaction_id] = _DataFuture(attempts)
            self._send(partition, TransactionDataRequest(self._req_id(partition), transaction_id))
        return pending.future

    def _data_received(self, response: TransactionDataResponse) -> None:
        partition = self._partitions.get(response.req_id.partition_id)
        if partition is None:
            return
        pending = partition.data.pop(response.transaction_id, None)
        if pending is None or pending.future.done():
            return
        prefetch = partition.prefetch
        if response.data is None:
            pending.future.set_exception(
                RpcError(response.exception_message or "no data and no error message")
            )
            pending.future.exception()  # asked ahead, it may never be awaited: do not warn
            if prefetch is not None:
                prefetch.arrived(response.transaction_id, None)
        elif crc32(response.data) == response.checksum:
            pending.future.set_result(response.data)
            if prefetch is not None:
                prefetch.arrived(response.transaction_id, len(response.data))
        elif pending.attempts < MAX_DATA_ATTEMPTS:
            log.warning(
                "transaction data checksum error, retrying: partition=%d txid=%d",
                partition.partition_id,
                response.transaction_id,
            )
            retry = self._data_future(partition.partition_id, response.transaction_id, pending.attempts + 1)
            retry.add_done_callback(lambda f: _chain(f, pending.future))
        else:
            pending.future.set_exception(
                DataChecksumError(
                    f"transaction data checksum error: partition={partition.partition_id} "
                    f"txid={response.transaction_id} after {MAX_DATA_ATTEMPTS} attempts"
                )
            )

    # -- high-water mark -------------------------------------------------------------------

    async def get_high_water_mark(self, partition_id: int) -> int:
        self._check_open()
        partition = self._partitions[partition_id]
        future = partition.high_water_mark
        if future is None:
            future = partition.high_water_mark = asyncio.get_running_loop().create_future()
            self._send(partition, HighWaterMarkRequest(self._req_id(partition)))
        deadline = asyncio.get_running_loop().time() + self.rpc_timeout_ms / 1000
        return await self._await(future, deadline, f"the high-water mark of partition {partition_id}")

    # -- admin calls to one server ---------------------------------------------------------

    async def call_server(self, endpoint: Endpoint, request: ClientMessage) -> Any:
        """Send an admin request (13-21) to ``endpoint``; its response message."""
        self._check_open()
        response_type = _ADMIN_RESPONSES[type(request)]
        loop = asyncio.get_running_loop()
        network_client = self._network_client_for(endpoint)
        deadline = loop.time() + self.rpc_timeout_ms / 1000
        while not network_client.ready:
            if network_client.refused is not None:
                raise network_client.refused
            if loop.time() >= deadline:
                raise ClientTimeoutError(
                    f"cannot reach server {endpoint} within {self.rpc_timeout_ms} ms"
                    + _last_connect_error(network_client)
                )
            await asyncio.sleep(0.01)
            network_client = self._network_client_for(endpoint)
        future: asyncio.Future[Any] = loop.create_future()
        self._admin.setdefault((endpoint, response_type), deque()).append(future)
        network_client.send(request)
        return await self._await(future, deadline, f"{type(request).__name__} from {endpoint}")

    # -- common ----------------------------------------------------------------------------

    async def _await(self, future: asyncio.Future[R], deadline: float, what: str) -> R:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            # The shield keeps the shared future for its other waiters; 0 s left still takes a
            # future already done, as wait_for did.
            async with asyncio.timeout(max(remaining, 0)):
                return await asyncio.shield(future)
        except TimeoutError:
            error = ClientTimeoutError(
                f"no answer for {what} within {self.rpc_timeout_ms} ms" + self._why_no_answer(future)
            )
            if not future.done():
                future.set_exception(error)  # every caller sharing it gives up together
                future.exception()  # retrieved here; others sharing it see it too
                self._forget(future)
            raise error from None

    def _why_no_answer(self, future: asyncio.Future[Any]) -> str:
        """The last connect error of the server ``future`` waits on, if it is not connected."""
        for partition in self._partitions.values():
            waits = [p.future for p in partition.data.values()]
            if partition.high_water_mark is future or any(f is future for f in waits):
                network_client = self.network_client_of(partition.partition_id)
                if network_client is None:
                    return "; no server is assigned the partition"
                return _last_connect_error(network_client)
        return ""

    def _forget(self, future: asyncio.Future[Any]) -> None:
        for partition in self._partitions.values():
            if partition.high_water_mark is future:
                partition.high_water_mark = None
            for transaction_id, pending in list(partition.data.items()):
                if pending.future is future:
                    del partition.data[transaction_id]

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError()

    async def close(self) -> None:
        await super().close()
        error = ClientClosedError()
        for partition in self._partitions.values():
            _fail(partition.take_waiting(), error)
        for waiters in self._admin.values():
            _fail(waiters, error)


def _last_connect_error(network_client: NetworkClient) -> str:
    error = network_client.last_connect_error
    if network_client.ready or error is None:
        return ""
    return f"; {network_client.endpoint}: last connect failed: {error}"


def _fail(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)
            future.exception()  # nobody may be waiting: do not warn "never retrieved"


def _chain(source: asyncio.Future[bytes], target: asyncio.Future[bytes]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
