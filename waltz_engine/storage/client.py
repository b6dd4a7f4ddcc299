"""Clients of a storage node's data port and admin port (reference §1.9).

One TLS connection each, with the Hello handshake and an OPEN (seqNum -1) that checks the
cluster key. Calls are pipelined: every request gets the next sequence number of the
connection, its future waits in a table until the response with that number arrives, and
a single read task per connection resolves them. A disconnect fails every pending call
with :class:`StorageRpcError` ("disconnected ..."); every call is bounded by a timeout.

Sending never awaits between taking a sequence number and writing the frame, so requests
issued in order by concurrent tasks reach the node in that order.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from waltz_engine.common.errors import ProtocolError, WaltzError
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.net.channel import (
    CONNECT_TIMEOUT_MS,
    WRITE_BUFFER_HIGH_BYTES,
    ConnectionClosedError,
    FramedConnection,
    connect,
)
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.storage.append_encoding import encode_append_batch, encode_append_records
from waltz_engine.storage.eager_calls import (
    EAGER_CALLS,
    OPEN_SEQ_NUM,
    AppendCall,
    EagerCall,
)
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.frame import FRAME_HEADER, MAX_FRAME_SIZE_BYTES, check_frame_length
from waltz_engine.wire.hello import STORAGE_CLIENT_HELLO_TEXT
from waltz_engine.wire.primitives import I32, SessionInfo
from waltz_engine.wire.storage_messages import (
    APPEND_REQUEST_TYPE,
    NO_PARTITION_ID,
    NO_SESSION_ID,
    STORAGE_CODEC,
    STORAGE_MAGIC,
    STORAGE_VERSION,
    SUCCESS_FRAME,
    SUCCESS_FRAME_PREFIX,
    StorageAppendRequest,
    StorageFailureResponse,
    StorageLastSessionInfoRequest,
    StorageLastSessionInfoResponse,
    StorageMaxTransactionIdRequest,
    StorageMaxTransactionIdResponse,
    StorageOpenRequest,
    StorageRecordHeaderListRequest,
    StorageRecordHeaderListResponse,
    StorageRecordHeaderRequest,
    StorageRecordHeaderResponse,
    StorageRecordListRequest,
    StorageRecordListResponse,
    StorageRecordRequest,
    StorageRecordResponse,
    StorageSetLowWaterMarkRequest,
    StorageSuccessResponse,
    StorageTruncateRequest,
)

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "SessionInfo",
    "StorageClient",
    "StorageRpcError",
    "StorageTimeoutError",
    "encode_append_records",
    "encode_append_batch",
]

log = logging.getLogger(__name__)

# How long one call waits for its response before giving up (the connection stays usable).
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
# A call unanswered with nothing received on its connection for this long makes the client send
# the node a cheap read (a probe) on that connection. Nothing else would cross it: a machine that
# lost power after taking the call, and came back, has no state of the connection, and the probe's
# bytes meet its reset; the calls then fail at once, not at their timeout (issue 32: the
# simulator's seed 4359, a store session waiting 30 s on a node back after 13 s, whose client gave
# up at 20 s). A node that is only slow answers the probe after the calls before it: harmless.
DEFAULT_PROBE_AFTER_MS = 5_000
FIRST_SEQ_NUM = 0
# type, sessionId, seqNum, partitionId: the part of an APPEND frame that differs per connection.
_APPEND_HEAD = struct.Struct(">bqqi")
_BOOL = struct.Struct(">?")
_APPEND_FRAME_HEAD = struct.Struct(FRAME_HEADER.format + _APPEND_HEAD.format.lstrip(">"))
# An APPEND's frame length beyond its encoded records: its head and the offline flag.
_APPEND_OVERHEAD_BYTES = _APPEND_HEAD.size + _BOOL.size
_OFFLINE_FLAG_BYTES = (_BOOL.pack(False), _BOOL.pack(True))  # by ``used_by_offline_recovery``

R = TypeVar("R")


class StorageRpcError(WaltzError):
    """The node answered FAILURE_RESPONSE (its message), or the connection was lost."""


class StorageTimeoutError(StorageRpcError):
    """No response within the call's timeout."""


class _RpcConnection:
    """What both clients share: connect + OPEN, sequence numbers, pending futures, read loop."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        codec: MessageCodec[Any],
        hello_text: str,
        request_timeout_ms: int,
        network: Network,
        probe_after_ms: int = 0,
    ) -> None:
        assert request_timeout_ms > 0
        assert probe_after_ms >= 0
        self._network = network
        self.name = name
        self.host = host
        self.port = port
        self.request_timeout_ms = request_timeout_ms
        self._ssl_context = ssl_context
        self._codec = codec
        self._hello_text = hello_text
        self._conn: FramedConnection | None = None
        self._closer: asyncio.Task[None] | None = None  # closes the connection after its end
        # seq num -> (future, deadline on the loop's clock, the timeout in ms for its message).
        self._pending: dict[int, tuple[asyncio.Future[Any] | EagerCall | AppendCall, float, int]] = {}
        # One timer per connection, at the earliest deadline, instead of one per request.
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_deadline = 0.0  # its time on the loop's clock (when it is set)
        self._next_seq_num = FIRST_SEQ_NUM
        self._closed_reason: str | None = None
        # The liveness probe (0: none): messages received, as counted when the timer was armed.
        self._probe_after_ms = probe_after_ms
        self._prober: asyncio.TimerHandle | None = None
        self._received = 0
        self._received_when_armed = 0
        self._probe_seq_num: int | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._conn is not None and self._closed_reason is None and not self._conn.closed

    async def _open(self, open_frame: bytes, timeout_ms: int) -> None:
        assert self._conn is None, "a client opens once; make a new one to reconnect"
        self._conn = await connect(
            self.host,
            self.port,
            self._ssl_context,
            {self._codec.version: self._codec},
            self._hello_text,
            timeout_ms,
            self._network,
        )
        # Responses are cut and handed out in the connection's read callback (no reader task).
        self._conn.dispatch(self._on_message, self._on_end, self._on_bytes)
        try:
            response = await self._exchange(OPEN_SEQ_NUM, [open_frame], timeout_ms)
        except BaseException:
            await self.close()
            raise
        if not self._is_success(response):
            await self.close()
            raise StorageRpcError(f"{self.name} {self.endpoint}: unexpected OPEN response {response!r}")

    def _is_success(self, response: Any) -> bool:
        raise NotImplementedError

    def _failure_message(self, response: Any) -> str | None:
        """The node's message when ``response`` is a FAILURE_RESPONSE, else None."""
        raise NotImplementedError

    def _open_connection(self) -> FramedConnection:
        """The connection to send a request on now; StorageRpcError when it is closed."""
        conn = self._conn
        if conn is None or self._closed_reason is not None:
            raise StorageRpcError(
                f"{self.name} {self.endpoint}: disconnected ({self._closed_reason or 'not open'})"
            )
        return conn

    def _take_seq_num(self) -> int:
        seq_num = self._next_seq_num
        self._next_seq_num += 1
        return seq_num

    async def _exchange(self, seq_num: int, frames: Sequence[bytes], timeout_ms: int | None = None) -> Any:
        """Send the frames of one request, wait for its response; FAILURE raises StorageRpcError."""
        conn = self._open_connection()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._register(seq_num, future, timeout_ms)
        try:
            conn.send_frames(frames)
            await conn.drain()
        except BaseException as e:
            # Nobody awaits the future now: out of the pending calls, nothing fails it later.
            # The connection's end (_fail_all) or the watchdog may have failed it already, while
            # the drain waited: mark that error retrieved (this caller raises its own), else
            # asyncio reports "Future exception was never retrieved".
            self._pending.pop(seq_num, None)
            if future.done() and not future.cancelled():
                future.exception()
            if isinstance(e, ConnectionClosedError):
                raise StorageRpcError(f"{self.name} {self.endpoint}: disconnected ({e})") from None
            raise
        try:
            response = await future
        finally:
            self._pending.pop(seq_num, None)
        message = self._failure_message(response)
        if message is not None:
            raise StorageRpcError(message)
        return response

    def _register(
        self, seq_num: int, waiter: asyncio.Future[Any] | EagerCall | AppendCall, timeout_ms: int | None
    ) -> None:
        """A call in flight until its response, the connection's end or its deadline."""
        assert seq_num not in self._pending, f"sequence number {seq_num} already in flight"
        loop = asyncio.get_running_loop()
        wait_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = loop.time() + wait_ms / 1000
        self._pending[seq_num] = (waiter, deadline, wait_ms)
        if self._prober is None and self._probe_after_ms > 0:
            self._received_when_armed = self._received
            self._prober = loop.call_later(self._probe_after_ms / 1000, self._probe)
        watchdog = self._watchdog
        if watchdog is None or deadline < self._watchdog_deadline:
            if watchdog is not None:
                watchdog.cancel()
            self._watchdog = loop.call_at(deadline, self._expire)
            self._watchdog_deadline = deadline

    def can_send_now(self) -> bool:
        """Open, and its write buffer below the high-water mark: a request may go without waiting."""
        conn = self._conn
        return (
            conn is not None
            and self._closed_reason is None
            and not conn.closed
            and conn.write_buffer_bytes() <= WRITE_BUFFER_HIGH_BYTES
        )

    def _note_request(self, message: Any) -> None:
        """A request is about to be sent (its fields name a probe's target)."""

    async def _call(self, build: Callable[[int], Any], expected: type[R]) -> R:
        seq_num = self._take_seq_num()
        message = build(seq_num)
        self._note_request(message)
        response = await self._exchange(seq_num, [self._codec.encode_frame(message)])
        if type(response) is not expected:
            raise StorageRpcError(
                f"{self.name} {self.endpoint}: expected {expected.__name__}, got {type(response).__name__}"
            )
        return response

    def _on_bytes(self, data: bytes) -> bool:
        """Answers recognised by their bytes before any decoding (see ``FramedConnection.dispatch``);
        False: none here, the frame decoder takes them."""
        return False

    def _probe_frame(self, seq_num: int) -> bytes | None:
        """A cheap read to send as a liveness probe (None: this connection sends none)."""
        return None

    def _probe(self) -> None:
        """The probe timer: with calls unanswered and nothing received since it was armed, send a
        probe (one at a time, its answer ignored); armed again while calls are pending."""
        self._prober = None
        conn = self._conn
        if conn is None or self._closed_reason is not None or not self._pending:
            return
        quiet = self._received == self._received_when_armed
        probe_seq_num = self._probe_seq_num
        if quiet and (probe_seq_num is None or probe_seq_num not in self._pending):
            seq_num = self._take_seq_num()
            frame = self._probe_frame(seq_num)
            if frame is not None:

                def answered(_response: Any, _error: BaseException | None) -> None:
                    self._pending.pop(seq_num, None)

                self._probe_seq_num = seq_num
                self._register(seq_num, EagerCall(answered), None)
                try:
                    conn.send_frames([frame])
                except ConnectionClosedError:
                    self._pending.pop(seq_num, None)
                    return
        if self._prober is None and self._pending:
            self._received_when_armed = self._received
            self._prober = asyncio.get_running_loop().call_later(self._probe_after_ms / 1000, self._probe)

    def _on_message(self, message: Any) -> None:
        """A response, in the connection's read callback: its caller's future is resolved here."""
        self._received += 1
        call = self._pending.get(message.seq_num)
        if call is None:
            # A late answer to a call that timed out: nobody waits for it any more.
            log.debug("%s %s: response to no pending call: %r", self.name, self.endpoint, message)
        elif not call[0].done():
            call[0].set_result(message)

    def _on_end(self, error: BaseException | None) -> None:
        """The connection ended (None: closed by the node); every pending call fails."""
        if error is None:
            reason = "closed by the node"
        elif isinstance(error, ProtocolError):
            reason = f"bad data from the node: {error}"
            log.warning("%s %s: %s", self.name, self.endpoint, reason)
        else:
            # str() of a reset or of some TLS alerts is empty: the type then says what happened.
            reason = f"connection lost: {' '.join(str(error).split()) or type(error).__name__}"
        self._fail_all(reason)
        conn = self._conn
        if conn is not None and self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(conn.close(), name=f"{self.name}-close")

    def _fail_all(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.cancel()
        pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(StorageRpcError(f"{self.name} {self.endpoint}: disconnected ({reason})"))

    def _expire(self) -> None:
        """The watchdog: fail the calls past their deadline, then wait for the next deadline."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        earliest: float | None = None
        # A snapshot: failing a call runs its callback (a direct batch's answer), which may end
        # other calls of this connection.
        for seq_num, (future, deadline, wait_ms) in list(self._pending.items()):
            if deadline <= now:
                if not future.done():
                    where = f"{self.name} {self.endpoint}"
                    error = f"{where}: no response to request {seq_num} within {wait_ms} ms"
                    future.set_exception(StorageTimeoutError(error))
            elif earliest is None or deadline < earliest:
                earliest = deadline
        # A call registered by a failed call's callback armed its own watchdog above: keep the
        # earlier one, so exactly one stays armed (an overwritten handle would fire unowned).
        current = self._watchdog
        if earliest is not None and (current is None or earliest < self._watchdog_deadline):
            if current is not None:
                current.cancel()
            self._watchdog = loop.call_at(earliest, self._expire)
            self._watchdog_deadline = earliest

    async def close(self) -> None:
        self._fail_all("client closed")
        closer, self._closer = self._closer, None
        if closer is not None:
            await asyncio.wait([closer])
            if not closer.cancelled():
                closer.exception()  # retrieved: the connection ended already
        if self._conn is not None:
            await self._conn.close()

    async def __aenter__(self: Any) -> Any:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class StorageClient(_RpcConnection):
    """A connection to a storage node's data port (``storage.port``)."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        key: uuid.UUID,
        num_partitions: int,
        *,
        used_by_offline_recovery: bool = False,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        network: Network = ASYNCIO_NETWORK,
        probe_after_ms: int = DEFAULT_PROBE_AFTER_MS,
    ) -> None:
        super().__init__(
            "storage",
            host,
            port,
            ssl_context,
            STORAGE_CODEC,
            STORAGE_CLIENT_HELLO_TEXT,
            request_timeout_ms,
            network,
            probe_after_ms,
        )
        self.key = key
        self.num_partitions = num_partitions
        self.used_by_offline_recovery = used_by_offline_recovery
        # The session and partition of the latest request: a probe reads that partition's max
        # txid in that session (a read never moves a session; a refusal is an answer too).
        self._probe_session_id = NO_SESSION_ID
        self._probe_partition_id = NO_PARTITION_ID

    async def open(self, timeout_ms: int = CONNECT_TIMEOUT_MS) -> None:
        request = StorageOpenRequest(
            NO_SESSION_ID, OPEN_SEQ_NUM, NO_PARTITION_ID, self.key, self.num_partitions
        )
        await self._open(STORAGE_CODEC.encode_frame(request), timeout_ms)

    def _is_success(self, response: Any) -> bool:
        return type(response) is StorageSuccessResponse

    def _on_bytes(self, data: bytes) -> bool:
        """Bytes that are whole SUCCESS answers and nothing else (an APPEND's answer, the commonest
        thing a replica says) go to their calls without the frame decoder and the codec: checked by
        their fixed first bytes, the rest unpacked with one struct. Anything else (another answer,
        a partial frame, bad bytes) is left to the decoder, which judges it as before."""
        frame_size = SUCCESS_FRAME.size
        size = len(data)
        if size % frame_size or not size:
            return False
        prefix = SUCCESS_FRAME_PREFIX
        starts_with = data.startswith  # (no slice made per frame)
        for offset in range(0, size, frame_size):
            if not starts_with(prefix, offset):
                return False
        unpack_from = SUCCESS_FRAME.unpack_from
        pending = self._pending
        self._received += 1  # (the liveness probe's count, as ``_on_message`` keeps it)
        for offset in range(0, size, frame_size):
            _, _, _, _, session_id, seq_num, partition_id = unpack_from(data, offset)
            call = pending.get(seq_num)
            if call is not None and isinstance(call[0], EAGER_CALLS) and not call[0]._done:
                call[0].succeeded()  # an APPEND sent from a callback: its answer's callback now
            else:
                self._on_message(StorageSuccessResponse(session_id, seq_num, partition_id))
        return True

    def _note_request(self, message: Any) -> None:
        self._probe_session_id = message.session_id
        self._probe_partition_id = message.partition_id

    def _probe_frame(self, seq_num: int) -> bytes | None:
        if self._probe_partition_id == NO_PARTITION_ID:
            return None
        request = StorageMaxTransactionIdRequest(
            self._probe_session_id, seq_num, self._probe_partition_id, self.used_by_offline_recovery
        )
        return STORAGE_CODEC.encode_frame(request)

    def _failure_message(self, response: Any) -> str | None:
        if type(response) is StorageFailureResponse:
            return response.exception.message or "storage node failure (no message)"
        return None

    async def last_session_info(self, session_id: int, partition_id: int) -> SessionInfo:
        offline = self.used_by_offline_recovery
        response = await self._call(
            lambda s: StorageLastSessionInfoRequest(session_id, s, partition_id, offline),
            StorageLastSessionInfoResponse,
        )
        return response.last_session_info

    async def set_low_water_mark(self, session_id: int, partition_id: int, low_water_mark: int) -> None:
        offline = self.used_by_offline_recovery
        await self._call(
            lambda s: StorageSetLowWaterMarkRequest(session_id, s, partition_id, low_water_mark, offline),
            StorageSuccessResponse,
        )

    async def truncate(self, session_id: int, partition_id: int, transaction_id: int) -> int:
        offline = self.used_by_offline_recovery
        response = await self._call(
            lambda s: StorageTruncateRequest(session_id, s, partition_id, transaction_id, offline),
            StorageMaxTransactionIdResponse,
        )
        return response.transaction_id

    async def append(self, session_id: int, partition_id: int, records: Sequence[Record]) -> None:
        offline = self.used_by_offline_recovery
        await self._call(
            lambda s: StorageAppendRequest(session_id, s, partition_id, tuple(records), offline),
            StorageSuccessResponse,
        )

    async def append_encoded(self, session_id: int, partition_id: int, encoded: bytes, count: int) -> None:
        """APPEND the output of :func:`encode_append_records` (``count`` records) without re-encoding it."""
        seq_num = self._take_seq_num()
        frames = self._append_frames(session_id, seq_num, partition_id, encoded, count)
        error = self._append_error(await self._exchange(seq_num, frames))
        if error is not None:
            raise error

    def send_append_call(
        self, session_id: int, partition_id: int, encoded: bytes, count: int, call: AppendCall
    ) -> None:
        """:meth:`append_encoded` without a task: sent now (check :meth:`can_send_now` first),
        answering ``call`` (its ``on_success`` or ``on_failure``) in the read callback of its
        answer (or at the connection's end, or its deadline)."""
        # (The lone commit's three sends: ``_open_connection`` and ``_take_seq_num`` inline.)
        conn = self._conn
        if conn is None or self._closed_reason is not None:
            conn = self._open_connection()  # (raises: not open)
        seq_num = self._next_seq_num
        self._next_seq_num = seq_num + 1
        frames = self._append_frames(session_id, seq_num, partition_id, encoded, count)
        call.seq_num = seq_num
        call._client = self
        self._register(seq_num, call, None)
        try:
            conn.send_frames(frames)
        except ConnectionClosedError as e:
            self._pending.pop(seq_num, None)
            raise StorageRpcError(f"{self.name} {self.endpoint}: disconnected ({e})") from None

    def _append_error(self, response: Any) -> BaseException | None:
        """What is wrong with a decoded answer to an APPEND (None: a SUCCESS)."""
        message = self._failure_message(response)
        if message is not None:
            return StorageRpcError(message)
        if type(response) is not StorageSuccessResponse:
            got = type(response).__name__
            return StorageRpcError(f"storage {self.endpoint}: expected SUCCESS, got {got}")
        return None

    def _append_frames(
        self, session_id: int, seq_num: int, partition_id: int, encoded: bytes, count: int
    ) -> list[bytes]:
        assert len(encoded) >= I32.size and I32.unpack_from(encoded, 0)[0] == count, "count does not match"
        length = _APPEND_OVERHEAD_BYTES + len(encoded)
        if length > MAX_FRAME_SIZE_BYTES:
            check_frame_length(length)  # (raises; a length is never negative here)
        self._probe_session_id = session_id  # a probe's target (see ``_probe_frame``)
        self._probe_partition_id = partition_id
        # The frame's header and the request's head in one pack; the flag's byte packed once.
        frame_head = _APPEND_FRAME_HEAD.pack(
            STORAGE_MAGIC, STORAGE_VERSION, length, APPEND_REQUEST_TYPE, session_id, seq_num, partition_id
        )
        return [frame_head, encoded, _OFFLINE_FLAG_BYTES[self.used_by_offline_recovery]]

    async def record_header(
        self, session_id: int, partition_id: int, transaction_id: int
    ) -> RecordHeader | None:
        response = await self._call(
            lambda s: StorageRecordHeaderRequest(session_id, s, partition_id, transaction_id),
            StorageRecordHeaderResponse,
        )
        return response.record_header

    async def record(self, session_id: int, partition_id: int, transaction_id: int) -> Record | None:
        response = await self._call(
            lambda s: StorageRecordRequest(session_id, s, partition_id, transaction_id), StorageRecordResponse
        )
        return response.record

    async def record_headers(
        self, session_id: int, partition_id: int, transaction_id: int, max_records: int
    ) -> list[RecordHeader]:
        response = await self._call(
            lambda s: StorageRecordHeaderListRequest(
                session_id, s, partition_id, transaction_id, max_records
            ),
            StorageRecordHeaderListResponse,
        )
        return list(response.record_headers)

    async def records(
        self, session_id: int, partition_id: int, transaction_id: int, max_records: int
    ) -> list[Record]:
        response = await self._call(
            lambda s: StorageRecordListRequest(session_id, s, partition_id, transaction_id, max_records),
            StorageRecordListResponse,
        )
        return list(response.records)

    async def max_transaction_id(self, session_id: int, partition_id: int) -> int:
        offline = self.used_by_offline_recovery
        response = await self._call(
            lambda s: StorageMaxTransactionIdRequest(session_id, s, partition_id, offline),
            StorageMaxTransactionIdResponse,
        )
        return response.transaction_id
