"""The lone commit's direct path (issue 33, sixth session) and its fallbacks, over real TLS.

One FeedData frame in a read is decoded without the decoder's buffer and applied in the read
callback; an append is written in its submit. Anything else takes the general path: a frame
split across reads, several frames in one read, a lock failure and its retry, a second submit
while the first is in flight or waits for room. Each must give what the general path gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from client_support.fake_server import FakeWaltzServer, _ConnectionSink
from client_support.harness import run
from client_support.static_driver import StaticDriver

from waltz_engine.client import MockServerPartition, WaltzClient, WaltzClientConfig
from waltz_engine.common.errors import ProtocolError
from waltz_engine.common.reqid import ReqId
from waltz_engine.wire.client_messages import CLIENT_CODECS, ClientMessage, FeedData, FeedSuspended
from waltz_engine.wire.client_stream import FEED_DATA_FRAME, ClientStreamDecoder
from waltz_engine.zk.payloads import PartitionInfo

FAST = {"not_ready_retry_ms": 50, "reconnect_delay_ms": 50}
SPLIT_AT_BYTES = 10  # where _SplitSink cuts each frame: inside a FeedData's reqId
LOCK = 7


class _SplitSink(_ConnectionSink):
    """Each frame in two writes (two TLS records, so two reads at the client)."""

    def deliver(self, message: ClientMessage) -> None:
        if not self.conn.closed:
            frame = self.conn.codec.encode_frame(message)
            self.conn.send_frame(frame[:SPLIT_AT_BYTES])
            self.conn.send_frame(frame[SPLIT_AT_BYTES:])


class _SplitServer(FakeWaltzServer):
    sink_type = _SplitSink


async def _started(server: FakeWaltzServer, callbacks: MockCallbacks, **config: Any) -> WaltzClient:
    await server.start()
    driver = StaticDriver({server.endpoint: [PartitionInfo(0, 1)]}, 1)
    return await WaltzClient.create(callbacks, WaltzClientConfig(mock_driver=driver, **{**FAST, **config}))


def _frames(version: int, messages: Sequence[ClientMessage]) -> bytes:
    return b"".join(CLIENT_CODECS[version].encode_frame(m) for m in messages)


def test_a_lone_feed_frame_decodes_as_the_general_path_however_the_reads_cut() -> None:
    feed = [FeedData(ReqId(1, 2, 0, seq), seq + 100, seq) for seq in range(3)]
    for version in sorted(CLIENT_CODECS):
        frame = _frames(version, feed[:1])
        assert len(frame) == FEED_DATA_FRAME.size
        assert ClientStreamDecoder(CLIENT_CODECS[version]).feed(frame) == feed[:1]  # the direct path
        stream = _frames(version, [FeedSuspended(ReqId(1, 2, 0, 9)), *feed])
        for size in (1, SPLIT_AT_BYTES, FEED_DATA_FRAME.size, len(stream)):
            # Reads of 36 bytes that start inside a frame, or hold a frame of another type
            # first, take the general path: the same messages in the same order.
            decoder = ClientStreamDecoder(CLIENT_CODECS[version])
            decoded = [m for at in range(0, len(stream), size) for m in decoder.feed(stream[at : at + size])]
            assert decoded == [FeedSuspended(ReqId(1, 2, 0, 9)), *feed]
            assert not decoder.buffered_bytes


def test_a_lone_feed_frame_with_a_bad_header_fails_as_before() -> None:
    frame = bytearray(_frames(max(CLIENT_CODECS), [FeedData(ReqId(1, 2, 0, 1), 5, 0)]))
    frame[0] ^= 0xFF  # the magic byte
    with pytest.raises(ProtocolError):
        ClientStreamDecoder(CLIENT_CODECS[max(CLIENT_CODECS)]).feed(bytes(frame))


def test_frames_split_across_reads_commit_and_apply_in_order() -> None:
    async def go() -> None:
        server = _SplitServer(MockServerPartition.create(1))
        callbacks = MockCallbacks()
        client = await _started(server, callbacks)
        try:
            contexts = [MockContext(f"t{i}") for i in range(5)]
            for context in contexts:
                await client.submit(context)
                assert await context.result()
            await client.flush()
            assert [txid for _, txid, _, _ in callbacks.applied] == list(range(5))
            assert all(c.events == ["completion:True", "application"] for c in contexts)
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_a_lock_failure_is_retried_and_commits_once() -> None:
    async def go() -> None:
        server = FakeWaltzServer(MockServerPartition.create(1))
        callbacks = MockCallbacks()
        client = await _started(server, callbacks)
        try:
            first, second = (
                MockContext("first", write_locks=[LOCK]),
                MockContext("second", write_locks=[LOCK]),
            )
            # Both built on the same client high-water mark: the second fails on the first's lock,
            # then is retried (a fresh builder) once the first is applied, and commits.
            await client.submit(first)
            await client.submit(second)
            assert await first.result() and await second.result()
            await client.flush()
            assert second.exec_count == 2 and first.exec_count == 1
            assert second.events == ["lock_failure", "completion:True", "application"]
            assert [txid for _, txid, _, _ in callbacks.applied] == [0, 1]
        finally:
            await client.close()
            await server.stop()

    run(go)


def test_two_submits_in_flight_and_one_waiting_for_room_keep_their_order() -> None:
    async def go() -> None:
        for capacity in (1, 2):
            server = FakeWaltzServer(MockServerPartition.create(1))
            callbacks = MockCallbacks()
            client = await _started(server, callbacks, max_concurrent_transactions=capacity)
            try:
                contexts = [MockContext(f"t{i}") for i in range(4)]
                # Submitted together: with room for one, each after the first waits for room
                # (the general path); with room for two, the second is sent with one in flight.
                await asyncio.gather(*(client.submit(c) for c in contexts))
                assert [await c.result() for c in contexts] == [True] * 4
                await client.flush()
                seq_nums = [req_id.seq_num for _, _, _, req_id in callbacks.applied]
                assert seq_nums == sorted(seq_nums) and len(seq_nums) == 4
                assert all(c.exec_count == 1 for c in contexts)
            finally:
                await client.close()
                await server.stop()

    run(go)
