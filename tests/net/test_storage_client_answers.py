"""StorageClient's answers recognised by their bytes (``_on_bytes``): whole SUCCESS frames go to
their calls without the frame decoder; anything else (several answers in one write, a SUCCESS
split across writes, a FAILURE among them) reaches the same calls through the decoder, with the
same outcomes.

The node is an in-process data port (TLS, real sockets) that answers OPEN, collects APPENDs and
answers them as each test writes its bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from storage_data_port_support import client_of_data_port

from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import FramedConnection
from waltz_engine.storage.client import StorageClient, StorageRpcError, encode_append_records
from waltz_engine.storage.eager_calls import AppendCall
from waltz_engine.wire.primitives import StorageRpcException
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    SUCCESS_FRAME,
    SUCCESS_FRAME_PREFIX,
    StorageAppendRequest,
    StorageFailureResponse,
    StorageOpenRequest,
    StorageSuccessResponse,
)

SESSION_ID = 7
PARTITION_ID = 3
TEST_BOUND_S = 30


def test_success_prefix_is_the_codecs_encoding() -> None:
    frame = STORAGE_CODEC.encode_frame(StorageSuccessResponse(-2, 1 << 40, 5))
    assert len(frame) == SUCCESS_FRAME.size
    assert frame.startswith(SUCCESS_FRAME_PREFIX)
    assert SUCCESS_FRAME.unpack_from(frame)[4:] == (-2, 1 << 40, 5)


_Append = tuple[StorageAppendRequest, FramedConnection]


class _OnDone(AppendCall):
    """An APPEND's outcome to ``on_done(None | error)``."""

    __slots__ = ("_on_done",)

    def __init__(self, on_done: Callable[[BaseException | None], None]) -> None:
        super().__init__()
        self._on_done = on_done

    def on_success(self) -> None:
        self._on_done(None)

    def on_failure(self, error: BaseException) -> None:
        self._on_done(error)


class _CountingClient(StorageClient):
    """Counts the reads its bytes' recognition took (True) and left to the decoder (False)."""

    recognised = 0
    left = 0

    def _on_bytes(self, data: bytes) -> bool:
        taken = super()._on_bytes(data)
        if taken:
            self.recognised += 1
        else:
            self.left += 1
        return taken


@contextlib.asynccontextmanager
async def _client_and_node() -> AsyncIterator[tuple[_CountingClient, asyncio.Queue[_Append]]]:
    appends: asyncio.Queue[_Append] = asyncio.Queue()

    async def handler(conn: FramedConnection) -> None:
        while (msg := await conn.receive()) is not None:
            if type(msg) is StorageOpenRequest:
                await conn.send(StorageSuccessResponse(msg.session_id, msg.seq_num, msg.partition_id))
            else:
                await appends.put((msg, conn))

    async with client_of_data_port(handler, _CountingClient) as client:
        yield client, appends


def _records(first_transaction_id: int, count: int) -> list[Record]:
    return [
        Record(
            first_transaction_id + i,
            ReqId(11, 1, PARTITION_ID, first_transaction_id + i),
            i,
            b"x" * (i + 1),
            i,
        )
        for i in range(count)
    ]


def test_answers_in_one_write_split_writes_and_failures() -> None:
    asyncio.run(_answers())


async def _answers() -> None:
    async with _client_and_node() as (client, appends):
        outcomes: dict[int, asyncio.Future[BaseException | None]] = {}
        loop = asyncio.get_running_loop()
        for n in range(5):
            done: asyncio.Future[BaseException | None] = loop.create_future()
            outcomes[n] = done
            client.send_append_call(
                SESSION_ID,
                PARTITION_ID,
                encode_append_records(_records(n * 2, 2)),
                2,
                _OnDone(done.set_result),
            )
        requests = [await appends.get() for _ in range(5)]
        conn = requests[0][1]
        # The frames the node read are the requests sent: one encoding, one head per request.
        for n, (request, _) in enumerate(requests):
            assert request.session_id == SESSION_ID and request.partition_id == PARTITION_ID
            assert list(request.records) == _records(n * 2, 2)
            assert not request.used_by_offline_recovery

        def success(n: int) -> bytes:
            request = requests[n][0]
            return STORAGE_CODEC.encode_frame(
                StorageSuccessResponse(SESSION_ID, request.seq_num, PARTITION_ID)
            )

        # Two whole SUCCESS answers in one write (recognised by their bytes).
        conn.send_frame(success(0) + success(1))
        await conn.drain()
        assert await outcomes[0] is None and await outcomes[1] is None
        assert client.recognised == 2  # the OPEN's answer and these two
        # One SUCCESS cut in two writes: the first part is not whole, the decoder takes both.
        frame = success(2)
        conn.send_frame(frame[:10])
        await conn.drain()
        await asyncio.sleep(0.05)
        assert not outcomes[2].done()
        conn.send_frame(frame[10:])
        await conn.drain()
        assert await outcomes[2] is None
        # A SUCCESS and a FAILURE together: the decoder again, each to its call.
        failure = StorageFailureResponse(
            SESSION_ID, requests[4][0].seq_num, PARTITION_ID, StorageRpcException("disk full", ())
        )
        conn.send_frame(success(3) + STORAGE_CODEC.encode_frame(failure))
        await conn.drain()
        assert await outcomes[3] is None
        error = await outcomes[4]
        assert isinstance(error, StorageRpcError) and "disk full" in str(error)
        # Left to the decoder: the cut frame's first part (its rest is not offered: a frame is
        # half buffered) and the pair with a FAILURE.
        assert client.recognised == 2 and client.left == 2
        assert client.is_open


def test_a_connections_end_fails_every_pending_append_once() -> None:
    """The node closes with APPENDs unanswered: each call fails once, with "disconnected". (Each
    call takes itself off the client's current table: the end replaced the table and failed the
    calls of the old one, which they changed under its iteration.)"""
    asyncio.run(_connection_end())


async def _connection_end() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    async with _client_and_node() as (client, appends):
        outcomes: list[BaseException | None] = []
        for n in range(5):
            client.send_append_call(
                SESSION_ID, PARTITION_ID, encode_append_records(_records(n, 1)), 1, _OnDone(outcomes.append)
            )
        requests = [await appends.get() for _ in range(5)]
        await requests[0][1].close()
        for _ in range(TEST_BOUND_S * 100):
            if len(outcomes) == 5 or errors:
                break
            await asyncio.sleep(0.01)
        assert not errors, errors
        assert len(outcomes) == 5
        assert all(isinstance(e, StorageRpcError) and "disconnected" in str(e) for e in outcomes), outcomes
        assert not client._pending


class _OfflineClient(_CountingClient):
    """A client of the offline recovery tool: its APPENDs carry the flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, used_by_offline_recovery=True, **kwargs)


def test_the_offline_flag_and_the_frame_are_the_codecs_encoding() -> None:
    """The APPEND's frame built for a lone send (its head packed once, the flag's byte by the
    client's kind) is byte for byte the codec's encoding of the same request, for both kinds."""
    asyncio.run(_flag_and_frame(_CountingClient, False))
    asyncio.run(_flag_and_frame(_OfflineClient, True))


async def _flag_and_frame(client_class: type[_CountingClient], offline: bool) -> None:
    received: list[Any] = []

    async def handler(conn: FramedConnection) -> None:
        while (msg := await conn.receive()) is not None:
            if type(msg) is StorageOpenRequest:
                await conn.send(StorageSuccessResponse(msg.session_id, msg.seq_num, msg.partition_id))
            else:
                received.append(msg)

    async with client_of_data_port(handler, client_class) as client:
        records = _records(4, 3)
        sent = client._append_frames(SESSION_ID, 9, PARTITION_ID, encode_append_records(records), 3)
        expected = StorageAppendRequest(SESSION_ID, 9, PARTITION_ID, tuple(records), offline)
        assert b"".join(sent) == STORAGE_CODEC.encode_frame(expected)
        client.send_append_call(
            SESSION_ID, PARTITION_ID, encode_append_records(records), 3, _OnDone(lambda _: None)
        )
        for _ in range(TEST_BOUND_S * 100):
            if received:
                break
            await asyncio.sleep(0.01)
        (request,) = received
        assert request.used_by_offline_recovery is offline and list(request.records) == records


def test_a_send_without_an_open_connection_fails_at_once_and_takes_no_seq_num() -> None:
    """The lone send's fallbacks: a client not open (never opened, or ended) declines with
    ``can_send_now`` and refuses ``send_append_call`` with StorageRpcError, registering nothing,
    so the replica session fails over to its task (which reconnects) with no call left behind."""
    asyncio.run(_not_open())


async def _not_open() -> None:
    async with _client_and_node() as (client, _):
        seq_num = client._next_seq_num
        assert client.can_send_now()
        await client.close()
        assert not client.can_send_now()
        outcomes: list[BaseException | None] = []
        try:
            client.send_append_call(
                SESSION_ID, PARTITION_ID, encode_append_records(_records(0, 1)), 1, _OnDone(outcomes.append)
            )
        except StorageRpcError as e:
            assert "disconnected" in str(e)
        else:
            raise AssertionError("sent on a closed client")
        assert client._next_seq_num == seq_num and not client._pending and not outcomes
