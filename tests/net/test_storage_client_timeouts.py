"""StorageClient's request timeouts: one watchdog per connection fails exactly the calls past
their deadline, whatever order the deadlines come in, and answered calls are unaffected.

The node is an in-process data port (TLS, real sockets) that answers OPEN and then only the
requests for partition ANSWERED_PARTITION.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from storage_data_port_support import client_of_data_port

from waltz_engine.net.channel import ConnectionClosedError, FramedConnection
from waltz_engine.storage.client import StorageClient, StorageRpcError, StorageTimeoutError
from waltz_engine.storage.eager_calls import EagerCall
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    StorageMaxTransactionIdRequest,
    StorageMaxTransactionIdResponse,
    StorageOpenRequest,
    StorageSuccessResponse,
)

ANSWERED_PARTITION = 0
SILENT_PARTITION = 1
MAX_TRANSACTION_ID = 41
SHORT_TIMEOUT_MS = 200
# Far beyond the test's bound: a call failing only at this deadline fails the test.
LONG_TIMEOUT_MS = 120_000
TEST_BOUND_S = 30


@contextlib.asynccontextmanager
async def _client_of_half_deaf_node(
    request_timeout_ms: int,
) -> AsyncIterator[tuple[StorageClient, list[int]]]:
    """An open client of a node that answers OPEN and then only ANSWERED_PARTITION's requests;
    also the seq nums of the requests it left unanswered."""
    silent: list[int] = []

    async def handler(conn: FramedConnection) -> None:
        while (msg := await conn.receive()) is not None:
            if type(msg) is StorageOpenRequest:
                await conn.send(StorageSuccessResponse(msg.session_id, msg.seq_num, msg.partition_id))
            elif msg.partition_id == ANSWERED_PARTITION:
                reply = StorageMaxTransactionIdResponse(
                    msg.session_id, msg.seq_num, msg.partition_id, MAX_TRANSACTION_ID
                )
                await conn.send(reply)
            else:
                silent.append(msg.seq_num)

    # As long as the calls: the OPEN's deadline must not be what ends a shorter call.
    async with client_of_data_port(handler, request_timeout_ms=request_timeout_ms) as client:
        yield client, silent


def _request(seq_num: int, partition_id: int) -> list[bytes]:
    return [STORAGE_CODEC.encode_frame(StorageMaxTransactionIdRequest(1, seq_num, partition_id, False))]


def test_a_call_past_its_deadline_fails_while_others_on_the_connection_are_answered() -> None:
    async def go() -> None:
        async with _client_of_half_deaf_node(SHORT_TIMEOUT_MS) as (client, silent):
            unanswered = asyncio.ensure_future(client.max_transaction_id(1, SILENT_PARTITION))
            assert await client.max_transaction_id(1, ANSWERED_PARTITION) == MAX_TRANSACTION_ID
            with pytest.raises(StorageTimeoutError, match=f"within {SHORT_TIMEOUT_MS} ms"):
                await unanswered
            # The connection stays usable, and the watchdog is armed again for the next call.
            assert client.is_open
            with pytest.raises(StorageTimeoutError, match=f"within {SHORT_TIMEOUT_MS} ms"):
                await client.max_transaction_id(1, SILENT_PARTITION)
            assert len(silent) == 2
            assert await client.max_transaction_id(1, ANSWERED_PARTITION) == MAX_TRANSACTION_ID

    asyncio.run(go())


def test_a_shorter_deadline_behind_a_longer_one_fails_first() -> None:
    async def go() -> None:
        async with _client_of_half_deaf_node(LONG_TIMEOUT_MS) as (client, _):
            first = client._take_seq_num()
            long_call: Any = asyncio.ensure_future(client._exchange(first, _request(first, SILENT_PARTITION)))
            second = client._take_seq_num()
            with pytest.raises(StorageTimeoutError, match=f"request {second} within {SHORT_TIMEOUT_MS} ms"):
                await client._exchange(second, _request(second, SILENT_PARTITION), SHORT_TIMEOUT_MS)
            assert not long_call.done()
            long_call.cancel()
            await asyncio.wait([long_call])

    asyncio.run(go())


def _armed_watchdogs(client: StorageClient) -> int:
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    return sum(1 for h in scheduled if not h.cancelled() and h._callback == client._expire)


def test_a_call_registered_by_a_failing_calls_callback_leaves_one_watchdog() -> None:
    """A direct batch's answer may send the next call from inside the watchdog's pass; the call
    gets its deadline and the connection keeps exactly one watchdog armed."""

    async def go() -> None:
        async with _client_of_half_deaf_node(LONG_TIMEOUT_MS) as (client, _):
            errors: list[BaseException | None] = []
            follow_up: list[int] = []

            def send_the_next(_response: Any, error: BaseException | None) -> None:
                errors.append(error)
                seq_num = client._take_seq_num()
                follow_up.append(seq_num)
                client._register(seq_num, EagerCall(lambda _r, e: errors.append(e)), SHORT_TIMEOUT_MS)

            long_seq_num = client._take_seq_num()
            client._register(long_seq_num, EagerCall(lambda _r, _e: None), LONG_TIMEOUT_MS)
            first = client._take_seq_num()
            client._register(first, EagerCall(send_the_next), SHORT_TIMEOUT_MS)
            async with asyncio.timeout(TEST_BOUND_S):
                while len(errors) < 2:
                    await asyncio.sleep(0.05)
            assert all(isinstance(e, StorageTimeoutError) for e in errors)
            assert f"request {follow_up[0]} within {SHORT_TIMEOUT_MS} ms" in str(errors[1])
            # The long call is still pending, watched by one watchdog, not two.
            assert long_seq_num in client._pending
            assert _armed_watchdogs(client) == 1

    asyncio.run(go())


def _run_leaving_no_unretrieved_error(
    monkeypatch: pytest.MonkeyPatch,
    drain: Callable[[StorageClient], Callable[[], Awaitable[None]]],
    body: Callable[[StorageClient], Awaitable[None]],
) -> None:
    """``body`` on an open client whose connection drains with ``drain(client)`` (the node's side
    as before); asyncio must then report no "Future exception was never retrieved" once the
    client's calls are unreferenced."""
    unretrieved: list[dict[str, Any]] = []
    plain_drain = FramedConnection.drain

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))
        async with _client_of_half_deaf_node(LONG_TIMEOUT_MS) as (client, _):
            conn = client._conn
            replacement = drain(client)

            async def patched(self: FramedConnection) -> None:
                await (replacement() if self is conn else plain_drain(self))

            monkeypatch.setattr(FramedConnection, "drain", patched)
            try:
                await body(client)
            finally:
                monkeypatch.setattr(FramedConnection, "drain", plain_drain)
        gc.collect()  # the calls' futures are unreferenced now: an unretrieved error is reported here
        await asyncio.sleep(0)

    asyncio.run(go())
    assert not [c for c in unretrieved if "never retrieved" in str(c.get("message"))], unretrieved


def test_a_drain_failing_after_the_connections_end_leaves_no_unretrieved_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection is lost while a call's drain waits: the connection's end fails the call's
    future first, then the drain raises. The caller gets StorageRpcError, and the future's own
    error is retrieved."""

    def drain(client: StorageClient) -> Callable[[], Awaitable[None]]:
        async def lost() -> None:
            client._on_end(ConnectionResetError("reset by the test"))  # fails the pending call
            raise ConnectionClosedError("connection lost during the drain")

        return lost

    async def body(client: StorageClient) -> None:
        seq_num = client._take_seq_num()
        with pytest.raises(StorageRpcError, match="disconnected"):
            await client._exchange(seq_num, _request(seq_num, SILENT_PARTITION))

    _run_leaving_no_unretrieved_error(monkeypatch, drain, body)


def test_a_call_cancelled_in_its_drain_leaves_no_call_for_the_connections_end_to_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller cancelled while its drain waits gives up the call: the connection's end later
    finds no such call, so no error is set on a future nobody will await."""
    draining = asyncio.Event()

    def drain(_client: StorageClient) -> Callable[[], Awaitable[None]]:
        async def blocked() -> None:
            draining.set()
            await asyncio.Event().wait()  # the send buffer never empties

        return blocked

    async def body(client: StorageClient) -> None:
        seq_num = client._take_seq_num()
        call = asyncio.ensure_future(client._exchange(seq_num, _request(seq_num, SILENT_PARTITION)))
        async with asyncio.timeout(TEST_BOUND_S):
            await draining.wait()
        call.cancel()
        await asyncio.wait([call])
        assert seq_num not in client._pending
        client._on_end(ConnectionResetError("reset by the test"))

    _run_leaving_no_unretrieved_error(monkeypatch, drain, body)
