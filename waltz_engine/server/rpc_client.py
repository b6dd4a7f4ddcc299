"""A small RPC client to a Waltz server's client port for the operator messages 13-22 (§3.3).

The original sends these through its ``InternalRpcClient`` (``WaltzNetworkClient``) with a
dummy ``ReqId(clientId, 0, partition or 0, 0)``; the server answers each with the matching
response type, so one request at a time on one connection is matched by type. Every call is
bounded by ``timeout_ms`` and every failure is a :class:`ServerRpcError` naming the server.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any, TypeVar

from waltz_engine.common.address import HostPort
from waltz_engine.common.errors import ProtocolError, WaltzError
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import ConnectionClosedError, FramedConnection, connect
from waltz_engine.net.tls import presents_certificate
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    EXTENDED_CLIENT_CODECS,
    AddPreferredPartitionRequest,
    AddPreferredPartitionResponse,
    AuthorizationFailure,
    CheckStorageConnectivityRequest,
    CheckStorageConnectivityResponse,
    RemovePreferredPartitionRequest,
    RemovePreferredPartitionResponse,
    ServerPartitionsAssignmentRequest,
    ServerPartitionsAssignmentResponse,
    ServerPartitionsHealthStatRequest,
    ServerPartitionsHealthStatResponse,
)
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT

R = TypeVar("R")

# Connect + TLS + Hello, and then each request's answer, must come within this.
DEFAULT_RPC_TIMEOUT_MS = 10_000
# A tool is no registered client: it has no id from <root>/ids/client.
TOOL_CLIENT_ID = -1
DUMMY_GENERATION = 0
DUMMY_SEQ_NUM = 0
NO_PARTITION = 0  # the partition field of a ReqId for requests about no partition
# Messages of other types a server may interleave before our answer (none expected) are skipped,
# but not forever: a peer that never answers what we asked is broken.
MAX_SKIPPED_MESSAGES = 1_000


class ServerRpcError(WaltzError):
    """A server could not be reached, closed the connection, or did not answer in time."""


class ServerRpcClient:
    """One connection to a server's client port; use as ``async with ServerRpcClient(...) as rpc``."""

    def __init__(
        self,
        endpoint: HostPort,
        ssl_context: ssl.SSLContext,
        *,
        client_id: int = TOOL_CLIENT_ID,
        timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
    ) -> None:
        if timeout_ms <= 0:
            raise ServerRpcError(f"timeout must be positive, got {timeout_ms} ms")
        self.endpoint = endpoint
        self.ssl_context = ssl_context
        self.client_id = client_id
        self.timeout_ms = timeout_ms
        self._conn: FramedConnection | None = None
        self._lock = asyncio.Lock()  # one request in flight: answers are matched by type

    async def open(self) -> None:
        assert self._conn is None, "already open"
        try:
            self._conn = await connect(
                self.endpoint.host,
                self.endpoint.port,
                self.ssl_context,
                # Our v5 (ACL refusals) only where a server could name us: with a certificate.
                EXTENDED_CLIENT_CODECS if presents_certificate(self.ssl_context) else CLIENT_CODECS,
                CLIENT_HELLO_TEXT,
                timeout_ms=self.timeout_ms,
            )
        except (ConnectionClosedError, ProtocolError, OSError, TimeoutError) as e:
            raise ServerRpcError(f"Server {self.endpoint}: {_describe(e)}") from None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> ServerRpcClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def protocol_version(self) -> int:
        assert self._conn is not None, "not open"
        return self._conn.version

    # --- the operator requests ------------------------------------------------------------

    async def check_storage_connectivity(self) -> dict[str, bool]:
        """Message 13: the server opens every storage node of the replica assignment."""
        response = await self._call(
            CheckStorageConnectivityRequest(self._req_id(NO_PARTITION)), CheckStorageConnectivityResponse
        )
        return {str(storage): ok for storage, ok in response.storage_connectivity_map}

    async def server_partitions(self) -> list[int]:
        """Message 15: the partitions the server holds now."""
        response = await self._call(
            ServerPartitionsAssignmentRequest(self._req_id(NO_PARTITION)), ServerPartitionsAssignmentResponse
        )
        return sorted(response.server_partition_assignments)

    async def add_preferred_partitions(self, partition_ids: Sequence[int]) -> bool:
        """Message 17: False when the server refuses (an id at or above its partition count)."""
        ids = _checked_ids(partition_ids)
        response = await self._call(
            AddPreferredPartitionRequest(self._req_id(ids[0]), ids), AddPreferredPartitionResponse
        )
        return response.result

    async def remove_preferred_partitions(self, partition_ids: Sequence[int]) -> bool:
        """Message 19: False when the server refuses."""
        ids = _checked_ids(partition_ids)
        response = await self._call(
            RemovePreferredPartitionRequest(self._req_id(ids[0]), ids), RemovePreferredPartitionResponse
        )
        return response.result

    async def partitions_health(self) -> dict[int, bool]:
        """Message 21 (protocol v4): whether each held partition's store session is healthy."""
        response = await self._call(
            ServerPartitionsHealthStatRequest(self._req_id(NO_PARTITION)), ServerPartitionsHealthStatResponse
        )
        return dict(response.server_partition_health_stats)

    # --- plumbing ----------------------------------------------------------------------------

    def _req_id(self, partition_id: int) -> ReqId:
        return ReqId(self.client_id, DUMMY_GENERATION, partition_id, DUMMY_SEQ_NUM)

    async def _call(self, request: Any, expected: type[R]) -> R:
        if self._conn is None:
            raise ServerRpcError(f"Server {self.endpoint}: not connected")
        conn = self._conn
        what = type(request).__name__
        async with self._lock:
            try:
                frame = conn.codec.encode_frame(request)
            except ProtocolError:
                raise ServerRpcError(
                    f"Server {self.endpoint} speaks client protocol v{conn.version}, which has no {what}"
                ) from None
            try:
                conn.send_frame(frame)
                await conn.drain()
                async with asyncio.timeout(self.timeout_ms / 1000):
                    return await self._answer(conn, expected)
            except TimeoutError:
                # A late answer would be taken for the next request's: drop the connection.
                await self.close()
                raise ServerRpcError(
                    f"Server {self.endpoint}: no answer to {what} within {self.timeout_ms} ms"
                ) from None
            except (ConnectionClosedError, ProtocolError, OSError) as e:
                await self.close()
                raise ServerRpcError(f"Server {self.endpoint}: {what} failed: {_describe(e)}") from None

    async def _answer(self, conn: FramedConnection, expected: type[R]) -> R:
        for _ in range(MAX_SKIPPED_MESSAGES):
            message = await conn.receive()
            if message is None:
                raise ConnectionClosedError("the server closed the connection")
            if isinstance(message, expected):
                return message
            if isinstance(message, AuthorizationFailure):
                where = f"partition {message.partition_id}" if message.partition_id >= 0 else "the cluster"
                raise ServerRpcError(
                    f"Server {self.endpoint}: not authorized: principal {message.principal} may not "
                    f"{message.operation} on {where} ({expected.__name__.replace('Response', 'Request')} "
                    "refused by the server's ACLs; nothing of it was done)"
                )
        raise ProtocolError(f"no {expected.__name__} among {MAX_SKIPPED_MESSAGES} messages")


def _checked_ids(partition_ids: Sequence[int]) -> tuple[int, ...]:
    """The original's ServerCli check: ``Partition array is empty / ... lower than 0``."""
    ids = tuple(dict.fromkeys(partition_ids))
    if not ids:
        raise ServerRpcError("Partition array is empty")
    if min(ids) < 0:
        raise ServerRpcError("one or more partitions are lower than 0")
    return ids


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "no answer in time"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
