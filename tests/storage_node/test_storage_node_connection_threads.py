"""Issue 33: a storage node reads a data connection on a thread of its own once its OPEN
succeeded (waltz_engine/storage/node/connection_threads.py). With real node processes: a
partition's order holds across two such connections, a peer that closes without close-notify
(as Netty's may) ends only its own connection and thread, and a node with threaded connections
open stops cleanly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_node_support import (
    HTTP_TIMEOUT_S,
    ISSUED_SESSION_ID,
    NODE_EXIT_TIMEOUT_S,
    StorageNodeProcess,
    make_records,
    minimal_storage_keys,
    start_storage_node,
)

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.storage.client import StorageClient
from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.storage.node.connection_threads import MAX_CONNECTION_THREADS
from waltz_engine.wire.storage_messages import STORAGE_CODEC, StorageAppendRequest

NUM_PARTITIONS = 2
SESSION_ID = ISSUED_SESSION_ID
# Appends one connection pipelines while the other reads the same partition, in rounds: a
# connection's requests of one round leave it as one write (FramedConnection.coalesce_writes: one
# TLS record of about 1 KiB, which the node's thread reads whole), so they reach the passes
# together however the machine schedules the client, as more than MAX_INLINE_REQUESTS would.
PIPELINED_ROUNDS = 6
REQUESTS_PER_ROUND = 10
# Lone appends tried until one runs on the writer's thread (each answered before the next): the
# partition stays busy a moment after the reader's thread answered its last request (that
# thread's bookkeeping), and an append arriving then queues for a pass of the pool instead.
MAX_LONE_APPENDS = 10
# How long a thread may take to notice its connection's end (it is told at once; this bounds
# a loaded machine).
THREAD_END_TIMEOUT_S = 30.0
METRICS_POLL_INTERVAL_S = 0.05


def _metrics(node: StorageNodeProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{node.jetty_port}/metrics"
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        metrics: dict[str, Any] = json.loads(response.read())
    return metrics


def _threads(node: StorageNodeProcess) -> int:
    return int(_metrics(node)["gauges"]["waltz-storage.data-connection-threads"]["value"])


def _thread_batches(node: StorageNodeProcess) -> int:
    return int(_metrics(node)["counters"]["waltz-storage.disk-connection-thread-batches"]["count"])


def _thread_passes(node: StorageNodeProcess) -> int:
    return int(_metrics(node)["counters"]["waltz-storage.disk-connection-thread-passes"]["count"])


def _wait_for_threads(node: StorageNodeProcess, count: int) -> None:
    deadline = time.monotonic() + THREAD_END_TIMEOUT_S
    while (now := _threads(node)) != count:
        assert time.monotonic() < deadline, f"{now} connection threads, expected {count}"
        time.sleep(METRICS_POLL_INTERVAL_S)


async def _opened(node: StorageNodeProcess) -> StorageClient:
    client = node.data_client()
    await client.open()
    await client.last_session_info(SESSION_ID, 0)
    return client


@pytest.fixture(scope="module")
def node(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNodeProcess]:
    with start_storage_node(zookeeper, tmp_path_factory.mktemp("node"), NUM_PARTITIONS) as node:
        yield node
        assert node.terminate() == 0, node.log_text()  # (its threads joined: a clean stop)


def test_two_threaded_connections_keep_a_partitions_order(node: StorageNodeProcess) -> None:
    """One connection pipelines appends (consecutive txids, so any reordering fails one) while
    another pipelines reads of the same partition's max txid: a connection's lone request runs
    on its thread when nothing of the partition waits, else queues behind the other
    connection's, and every answer follows its connection's order. Requests read together go
    to a pass, which runs on the thread that read them when no other pass runs.

    Both hold by construction, not by the machine's timing: the lone append that ran on the
    writer's thread left the partition idle and no pass running (it claimed the partition, which
    a pass of it would hold, and the writer's thread finishes with it before reading more), and
    each round's requests of a connection arrive in one read, so the first of the first round's
    two reads to be routed finds no pass running and runs one on its thread."""

    async def go() -> tuple[list[Any], list[Any], int, int, int]:
        writer, reader = await _opened(node), await _opened(node)
        try:
            assert _threads(node) == 2
            # A lone append: the writer's thread runs it itself (once the partition is idle).
            txid = 0
            while True:
                batches = _thread_batches(node)
                await writer.append(SESSION_ID, 0, make_records(txid, 1))
                txid += 1
                if _thread_batches(node) > batches:
                    break
                assert txid < MAX_LONE_APPENDS, "no lone append ran on the writer's thread"
            passes_before = _thread_passes(node)
            for client in (writer, reader):
                assert client._conn is not None
                client._conn.coalesce_writes(lambda: True)
            appends: list[asyncio.Future[None]] = []
            reads: list[asyncio.Future[int]] = []
            for _ in range(PIPELINED_ROUNDS):
                appends += [
                    asyncio.ensure_future(writer.append(SESSION_ID, 0, make_records(txid + i, 1)))
                    for i in range(REQUESTS_PER_ROUND)
                ]
                txid += REQUESTS_PER_ROUND
                reads += [
                    asyncio.ensure_future(reader.max_transaction_id(SESSION_ID, 0))
                    for _ in range(REQUESTS_PER_ROUND)
                ]
                # The round's tasks send in the next loop turn, each connection's requests as one
                # write at its end; the next round's after it (behind the passes of this one).
                await asyncio.sleep(0)
            appended = await asyncio.gather(*appends, return_exceptions=True)
            seen = await asyncio.gather(*reads, return_exceptions=True)
            final = await reader.max_transaction_id(SESSION_ID, 0)
            return appended, seen, final, txid, _thread_passes(node) - passes_before
        finally:
            await writer.close()
            await reader.close()

    appended, seen, final, appends_sent, passes_here = node.run(go())
    assert appended == [None] * (PIPELINED_ROUNDS * REQUESTS_PER_ROUND)
    assert all(isinstance(txid, int) for txid in seen), seen
    assert seen == sorted(seen), "a connection's answers left its order"
    assert final == appends_sent - 1
    assert passes_here > 0, "no pass ran on a connection's thread"
    _wait_for_threads(node, 0)


def test_a_peer_closing_without_close_notify_ends_only_its_connection(node: StorageNodeProcess) -> None:
    """A peer that drops the connection without TLS's close-notify, once between frames and
    once in the middle of one: its thread ends, the node serves the next connection."""
    request = StorageAppendRequest(SESSION_ID, 99, 1, tuple(make_records(0, 1, 1)), False)
    frame = STORAGE_CODEC.encode_frame(request)

    async def drop(half_frame: bool) -> None:
        client = await _opened(node)
        assert _threads(node) == 1
        conn = client._conn
        assert conn is not None
        if half_frame:
            conn._transport.write(frame[: len(frame) // 2])
        conn._transport.abort()  # no close-notify (SocketTransport's abort skips unwrap)
        await client.close()

    async def serve_next(txid: int) -> int:
        client = await _opened(node)
        try:
            await client.append(SESSION_ID, 1, make_records(txid, 1, 1))
            return await client.max_transaction_id(SESSION_ID, 1)
        finally:
            await client.close()

    for txid, half_frame in enumerate((False, True)):
        node.run(drop(half_frame))
        _wait_for_threads(node, 0)
        assert node.run(serve_next(txid)) == txid
    assert "into a frame" in node.log_text(), "the half frame's end was not named"
    _wait_for_threads(node, 0)


def test_a_node_with_threaded_connections_stops_cleanly(zookeeper: str, tmp_path: Path) -> None:
    """SIGTERM while two threaded connections are open (one idle, one between appends): the
    node closes them, joins their threads and exits 0; the appends it answered are on disk
    when it starts again."""
    with start_storage_node(zookeeper, tmp_path / "node", NUM_PARTITIONS) as node:

        async def go() -> None:
            idle, busy = await _opened(node), await _opened(node)
            try:
                assert _threads(node) == 2
                for txid in range(3):
                    await busy.append(SESSION_ID, 0, make_records(txid, 1))
                started = time.monotonic()
                os.kill(node.pid, signal.SIGTERM)
                code = await asyncio.get_running_loop().run_in_executor(None, node.wait_exit)
                assert code == 0, node.log_text()
                assert time.monotonic() - started < NODE_EXIT_TIMEOUT_S
            finally:
                await idle.close()
                await busy.close()

        node.run(go())
        log = node.log_text()
        assert "storage node stopped" in log
        assert "did not end" not in log
        node.start()

        async def after() -> int:
            client = await _opened(node)
            try:
                return await client.max_transaction_id(SESSION_ID, 0)
            finally:
                await client.close()

        assert node.run(after()) == 2


def test_the_thread_count_is_a_config_key(tmp_path: Path) -> None:
    """``storage.data.connection.threads``: MAX_CONNECTION_THREADS by default, 0 for the loop's
    path only, above the bound a one-line error."""
    keys = minimal_storage_keys(tmp_path)
    assert StorageConfig.from_config(Config(keys)).data_connection_threads == MAX_CONNECTION_THREADS
    off = StorageConfig.from_config(Config({**keys, "storage.data.connection.threads": 0}))
    assert off.data_connection_threads == 0
    with pytest.raises(ConfigError, match="storage.data.connection.threads.*at most 16"):
        StorageConfig.from_config(
            Config({**keys, "storage.data.connection.threads": MAX_CONNECTION_THREADS + 1})
        )
