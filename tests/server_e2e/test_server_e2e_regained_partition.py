"""Issue 21 item 1 with real processes: a server that gets a partition back answers from recovery.

The path that broke the smoke run (four transactions in the log while their clients had been told
they failed): server X owns a partition; X stalls (a pause, a long GC, a slow ZooKeeper link) while
the partition moves to server Y and back to X. X never sees Y's assignment, only its own newer
generation, and used to keep its old store session: its high-water mark predated Y's commits. A
client whose appends Y had committed (their feed not yet applied) remounted on X and got READY and a
FLUSH answer at X's old mark, below its own committed appends, so it took them for failed and
retried them: duplicates. Now X opens a store session at the new generation, whose recovery sees
Y's commits, before it answers anything; a mount from a client that knows a newer generation than
X does is told NOT_READY until X catches up.

This test plays the client by hand on the wire so it can hold Y's feed unread, the window the
smoke run hit by chance.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cluster_support import local_cluster, wait_assigned

from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import FramedConnection, connect
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    NO_LOCKS,
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    AppendRequest,
    FeedData,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
)
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT
from waltz_engine.zk.cluster import read_server_descriptors
from waltz_engine.zk.cluster_manager import force_assign
from waltz_engine.zk.connection import ZooKeeperSettings
from waltz_engine.zk.connection import connect as zk_connect

CLIENT_ID = 4242
PARTITION = 0
RECEIVE_TIMEOUT_S = 30.0
POLL_S = 0.05
MOUNT_ATTEMPTS = 600  # NOT_READY answers, POLL_S apart: 30 s
FIRST_APPENDS = 3
APPENDS_ON_Y = 4


class RawClient:
    """One client connection on the wire ('L' v4), as the client library would speak it."""

    def __init__(self, connection: FramedConnection) -> None:
        self.connection = connection

    @classmethod
    async def open(cls, port: int) -> RawClient:
        connection = await connect(
            "127.0.0.1", port, client_context(TlsConfig()), {4: CLIENT_CODECS[4]}, CLIENT_HELLO_TEXT
        )
        return cls(connection)

    async def receive_until(self, kind: type) -> list[Any]:
        got: list[Any] = []
        while True:
            async with asyncio.timeout(RECEIVE_TIMEOUT_S):
                message = await self.connection.receive()
            assert message is not None, f"connection closed after {got}"
            got.append(message)
            if isinstance(message, kind):
                return got

    async def mount(self, generation: int, seq: int, client_high_water_mark: int) -> list[FeedData]:
        """Mount until READY (retrying NOT_READY); the feed that came before READY."""
        for attempt in range(MOUNT_ATTEMPTS):
            req_id = ReqId(CLIENT_ID, generation, PARTITION, seq)
            await self.connection.send(MountRequest(req_id, client_high_water_mark, seq * 1000 + attempt))
            got = await self.receive_until(MountResponse)
            if got[-1].partition_state == PARTITION_STATE_READY:
                return [message for message in got if isinstance(message, FeedData)]
            assert got[-1].partition_state == PARTITION_STATE_NOT_READY, got[-1]
            await asyncio.sleep(POLL_S)
        raise AssertionError(f"partition {PARTITION} was never READY at generation {generation}")

    async def append_and_flush(self, generation: int, seqs: range, client_high_water_mark: int) -> int:
        for seq in seqs:
            data = b"txn-%d" % seq
            req_id = ReqId(CLIENT_ID, generation, PARTITION, seq)
            await self.connection.send(
                AppendRequest(
                    req_id, client_high_water_mark, NO_LOCKS, NO_LOCKS, NO_LOCKS, 0, data, crc32(data)
                )
            )
        return await self.flush(ReqId(CLIENT_ID, generation, PARTITION, seqs[-1]))

    async def flush(self, req_id: ReqId) -> int:
        await self.connection.send(FlushRequest(req_id))
        got = await self.receive_until(FlushResponse)
        return int(got[-1].transaction_id)

    async def close(self) -> None:
        await self.connection.close()


def _force(settings: ZooKeeperSettings, server_id: int) -> int:
    with zk_connect(settings) as zk:
        force_assign(zk, settings.cluster_root, PARTITION, server_id)
    return wait_assigned(settings, server_id, PARTITION)


@pytest.mark.slow
def test_a_server_that_regains_a_partition_answers_mounts_and_flushes_from_its_recovery(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str
) -> None:
    with local_cluster(tmp_path_factory, storages=1, servers=2, partitions=1, zookeeper=zookeeper) as cluster:
        settings = ZooKeeperSettings(zookeeper, cluster.cluster_root)
        with zk_connect(settings) as zk:
            ids_by_port = {d.port: d.server_id for d in read_server_descriptors(zk, cluster.cluster_root)}
        # The coordinator (lowest id) must stay awake to move the partition: it is Y; X is paused.
        y_id, x_id = sorted(ids_by_port.values())
        x = next(node for node in cluster.servers if ids_by_port[node.port] == x_id)
        y = next(node for node in cluster.servers if ids_by_port[node.port] == y_id)

        async def scenario() -> tuple[int, list[int], int]:
            first_generation = _force(settings, x_id)
            on_x = await RawClient.open(x.port)
            await on_x.mount(first_generation, 1, -1)
            high_water_mark = await on_x.append_and_flush(first_generation, range(1, 1 + FIRST_APPENDS), -1)
            assert high_water_mark == FIRST_APPENDS - 1
            x.pause()
            try:
                y_generation = _force(settings, y_id)
                on_y = await RawClient.open(y.port)
                await on_y.mount(y_generation, 10, high_water_mark)
                seqs = range(11, 11 + APPENDS_ON_Y)
                # Committed on Y; this client never reads that feed (the window of the smoke run).
                y_high_water_mark = await on_y.append_and_flush(y_generation, seqs, high_water_mark)
                assert y_high_water_mark == high_water_mark + APPENDS_ON_Y
                back_generation = _force(settings, x_id)
            finally:
                x.resume()
            await on_x.close()
            back_on_x = await RawClient.open(x.port)
            feed = await back_on_x.mount(back_generation, 20, high_water_mark)
            flushed = await back_on_x.flush(ReqId(CLIENT_ID, y_generation, PARTITION, seqs[-1]))
            await back_on_x.close()
            await on_y.close()
            return y_high_water_mark, [message.transaction_id for message in feed], flushed

        y_high_water_mark, fed, flushed = asyncio.run(scenario())
        # Before the fix X answered READY with nothing to feed and flushed at its old mark (2): the
        # client would have taken its four committed appends for failed.
        assert fed == list(range(FIRST_APPENDS, y_high_water_mark + 1))
        assert flushed >= y_high_water_mark
