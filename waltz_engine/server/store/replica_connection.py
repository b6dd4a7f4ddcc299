"""Connections to storage nodes, shared by every partition of a server (``ReplicaConnection*``).

One :class:`StorageClient` per storage node; a :class:`ReplicaConnection` binds it to one
partition and one store session id. A connection that was lost is replaced on the next
:meth:`StorageConnections.get`. The requests that the replica sessions of all partitions send to
one node in one event loop turn leave in one write (one frame each, as the original sends them).

The answers that decide nothing do not wake the server (issue 33): once a batch has its quorum,
a node whose only pending calls are batches decided without it (the third of three replicas,
with one appender) is muted (:meth:`StorageConnections.defer_decided_answers`): the selector
stops reporting its connection readable. Its answer is read from the callback that sends that
node its next request (:meth:`_SharedStorageClient.read_deferred_answers`, before the write), or
by a timer at most :data:`DEFERRED_ANSWER_READ_MS` later; any other request sent on it un-mutes
it first. So a lone commit costs the server three loop turns (the client's request and two
answers), not four. While muted, the calls stay in the pending table (the watchdog and the
liveness probe see them as before), a reset is still reported at once (epoll reports errors
always), and a clean close by the node is seen within the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from waltz_engine.common.address import parse_host_port
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.net.channel import CONNECT_TIMEOUT_MS
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.server.store.voting import Voting
from waltz_engine.storage.client import SessionInfo, StorageClient
from waltz_engine.storage.eager_calls import AppendCall, EagerCall

# A muted connection (see the module's doc) is read at the latest this long after it was muted,
# with no request sent to its node meanwhile: the bound on a deferred answer, and on the time to
# see a node's failure that a muted connection hides (a clean close; a reset is seen at once).
DEFERRED_ANSWER_READ_MS = 100
# A connection with more pending calls than this is not muted (checking them costs more than a
# loop turn could save; with many pending, answers share their turns anyway).
MAX_DEFERRED_CALLS = 8


class VotedAppendCall(AppendCall):
    """A replica's APPEND whose answer is one vote on ``voting``: once ``voting`` is decided,
    reading the answer may wait (:meth:`StorageConnections.defer_decided_answers`)."""

    __slots__ = ("voting",)

    def __init__(self, voting: Voting) -> None:
        super().__init__()
        self.voting = voting


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
        self._clients: dict[str, _SharedStorageClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    def new_client(self, storage: str) -> _SharedStorageClient:
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

    def defer_decided_answers(self) -> None:
        """A batch just got its quorum: mute each node whose pending calls (at most
        :data:`MAX_DEFERRED_CALLS`) are all a replica's APPEND of a batch decided (True: a quorum
        wrote it)."""
        for client in self._clients.values():
            pending = client._pending
            if pending and not client.deferring and len(pending) <= MAX_DEFERRED_CALLS:
                for call, _, _ in pending.values():
                    if not isinstance(call, VotedAppendCall) or not call.voting.decision:
                        break
                else:
                    client.defer()

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
    one write at its end; a request to an idle node leaves at once, costing no loop turn. Its
    answers that decide nothing are read late (see the module's doc)."""

    # Muted (``defer``) and not un-muted since.
    deferring = False
    _deferral_timer: asyncio.TimerHandle | None = None
    _mute: Callable[[], bool] | None = None
    _unmute: Callable[[bool], None] | None = None

    async def open(self, timeout_ms: int = CONNECT_TIMEOUT_MS) -> None:
        await super().open(timeout_ms)
        assert self._conn is not None
        # The request being sent is in the table already.
        self._conn.coalesce_writes(lambda: len(self._pending) > 1)
        transport = self._conn.writer.transport
        self._mute = getattr(transport, "mute_reading", None)
        self._unmute = getattr(transport, "unmute_reading", None)

    def defer(self) -> None:
        """Mute the connection, its pending calls all decided (see
        :meth:`StorageConnections.defer_decided_answers`), if the transport can be; the timer
        reads it within :data:`DEFERRED_ANSWER_READ_MS`."""
        mute = self._mute
        if mute is None or not mute():
            return
        self.deferring = True
        # Any request registered while muted un-mutes first: the class's ``_register`` is shadowed
        # by this instance's while it is (no cost on the path of a request otherwise).
        self.__dict__["_register"] = self._register_deferred
        if self._deferral_timer is None:
            # One timer per bound, not per mute: armed at a mute, it reads the connection if it
            # is muted when it fires (any mute since it was armed is at most that old).
            loop = asyncio.get_running_loop()
            self._deferral_timer = loop.call_later(DEFERRED_ANSWER_READ_MS / 1000, self._deferral_due)

    def read_deferred_answers(self) -> None:
        """Before a request goes to the node (from a callback that is not this connection's read):
        un-mute, and read now what it answered meanwhile (it votes, in order, on its decided
        batches), so that its next answer wakes the server as usual."""
        self._end_deferral(True)

    def _end_deferral(self, read_now: bool) -> None:
        self.deferring = False
        self.__dict__.pop("_register", None)
        unmute = self._unmute
        assert unmute is not None
        unmute(read_now)

    def _deferral_due(self) -> None:
        self._deferral_timer = None
        if self.deferring:
            self._end_deferral(True)

    def _register_deferred(
        self, seq_num: int, waiter: asyncio.Future[Any] | EagerCall | AppendCall, timeout_ms: int | None
    ) -> None:
        """``_register`` while muted: a request sent other than after ``read_deferred_answers``
        (a task's call, a probe, a batch sent from an answer's callback, maybe in this
        connection's own read) un-mutes; its answer must wake the server, and what came
        meanwhile is read in the next loop turn."""
        self._end_deferral(False)
        self._register(seq_num, waiter, timeout_ms)

    def _fail_all(self, reason: str) -> None:
        self.deferring = False
        self.__dict__.pop("_register", None)
        timer, self._deferral_timer = self._deferral_timer, None
        if timer is not None:
            timer.cancel()
        super()._fail_all(reason)

    @property
    def writes(self) -> int:
        """Writes handed to the transport since the connection opened (its OPEN included)."""
        return 0 if self._conn is None else self._conn.writes


class ReplicaConnection:
    """Storage calls for one replica (partition on one storage node) in one store session."""

    def __init__(self, client: StorageClient, partition_id: int, session_id: int) -> None:
        self.client = client
        # The shared connection whose answers may be read late (None: another client, a test's).
        self.shared = client if isinstance(client, _SharedStorageClient) else None
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
