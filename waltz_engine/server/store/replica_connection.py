"""Connections to storage nodes, shared by every partition of a server (``ReplicaConnection*``).

One :class:`StorageClient` per storage node; a :class:`ReplicaConnection` binds it to one
partition and one store session id. A connection that was lost is replaced on the next
:meth:`StorageConnections.get`. The requests that the replica sessions of all partitions send to
one node in one event loop turn leave in one write (one frame each, as the original sends them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import Callable, Sequence
from functools import partial

from waltz_engine.common.address import parse_host_port
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.net.channel import CONNECT_TIMEOUT_MS
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.storage.client import SessionInfo, StorageClient
from waltz_engine.storage.eager_calls import AppendCall


class StorageConnections:
    def __init__(
        self,
        ssl_context: ssl.SSLContext | None,
        key: uuid.UUID,
        num_partitions: int,
        request_timeout_ms: int,
        network: Network = ASYNCIO_NETWORK,
    ) -> None:
        self._ssl_context = ssl_context
        self._network = network
        self._key = key
        self._num_partitions = num_partitions
        self._request_timeout_ms = request_timeout_ms
        self._clients: dict[str, StorageClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def new_client(self, storage: str) -> StorageClient:
        host, port = parse_host_port(storage)
        return _SharedStorageClient(
            host,
            port,
            self._ssl_context,
            self._key,
            self._num_partitions,
            request_timeout_ms=self._request_timeout_ms,
            network=self._network,
        )

    async def get(self, storage: str) -> StorageClient:
        """The open client of ``storage``, connecting (once, for all waiting callers) if needed."""
        lock = self._locks.setdefault(storage, asyncio.Lock())
        async with lock:
            if self._closed:
                raise ConnectionError("store closed")
            client = self._clients.get(storage)
            if client is not None and client.is_open:
                return client
            if client is not None:
                await client.close()
                del self._clients[storage]
            client = self.new_client(storage)
            await client.open(self._request_timeout_ms)
            self._clients[storage] = client
            return client

    async def drop(self, storage: str) -> None:
        """Close the client of a storage node that left the assignment."""
        client = self._clients.pop(storage, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = self._clients, {}
        for client in clients.values():
            with contextlib.suppress(Exception):
                await client.close()


class _SharedStorageClient(StorageClient):
    """The connection every partition's replica sessions share: while requests are outstanding
    on it (the node is at work, their answers are due), the ones sent in a loop turn leave in
    one write at its end; a request to an idle node leaves at once, costing no loop turn."""

    async def open(self, timeout_ms: int = CONNECT_TIMEOUT_MS) -> None:
        await super().open(timeout_ms)
        assert self._conn is not None
        # The request being sent is in the table already.
        self._conn.coalesce_writes(lambda: len(self._pending) > 1)

    @property
    def writes(self) -> int:
        """Writes handed to the transport since the connection opened (its OPEN included)."""
        return 0 if self._conn is None else self._conn.writes


class ReplicaConnection:
    """Storage calls for one replica (partition on one storage node) in one store session."""

    def __init__(self, client: StorageClient, partition_id: int, session_id: int) -> None:
        self.client = client
        self.partition_id = partition_id
        self.session_id = session_id
        # The lone append's calls, bound once (a replica's every batch goes through them): whether
        # a request may go without waiting; :meth:`append_encoded` without a task, its
        # ``AppendCall`` getting its outcome (see ``StorageClient.send_append_call``).
        self.can_send_now: Callable[[], bool] = client.can_send_now
        self.send_append_call: Callable[[bytes, int, AppendCall], None] = partial(
            client.send_append_call, session_id, partition_id
        )

    async def last_session_info(self) -> SessionInfo:
        return await self.client.last_session_info(self.session_id, self.partition_id)

    async def set_low_water_mark(self, low_water_mark: int) -> None:
        await self.client.set_low_water_mark(self.session_id, self.partition_id, low_water_mark)

    async def truncate(self, transaction_id: int) -> int:
        return await self.client.truncate(self.session_id, self.partition_id, transaction_id)

    async def max_transaction_id(self) -> int:
        return await self.client.max_transaction_id(self.session_id, self.partition_id)

    async def append(self, records: Sequence[Record]) -> None:
        await self.client.append(self.session_id, self.partition_id, records)

    async def append_encoded(self, encoded: bytes, count: int) -> None:
        await self.client.append_encoded(self.session_id, self.partition_id, encoded, count)

    async def records(self, transaction_id: int, max_records: int) -> list[Record]:
        return await self.client.records(self.session_id, self.partition_id, transaction_id, max_records)

    async def record(self, transaction_id: int) -> Record | None:
        return await self.client.record(self.session_id, self.partition_id, transaction_id)

    async def record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        return await self.client.record_headers(
            self.session_id, self.partition_id, transaction_id, max_records
        )
