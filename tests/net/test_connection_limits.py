"""What a listening port admits (issue 13, item 4): idle sockets cost no memory for ever, a
handshake has a time limit, connections are capped per node and per peer address, and the
bytes buffered per connection are capped. With real storage node processes and sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from storage_node_support import (
    HOST,
    StorageNodeProcess,
    client_ssl,
    make_records,
    minimal_storage_keys,
    start_storage_node,
)

from waltz_engine.common.config import Config, ConfigError
from waltz_engine.net.channel import ConnectionClosedError, FramedConnection, connect, serve
from waltz_engine.net.connection_limits import (
    HANDSHAKE_TIMEOUT_MS,
    MAX_BUFFERED_BYTES_PER_CONNECTION,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_PEER,
    ConnectionGate,
    ConnectionLimits,
)
from waltz_engine.net.tls import TlsConfig, server_context
from waltz_engine.server.config import ServerConfig
from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.wire.storage_messages import STORAGE_CODEC, StorageOpenRequest

NUM_PARTITIONS = 1
FLOOD_CONNECTIONS = 2_000
RSS_SLACK_MB = 50
CONNECT_TIMEOUT_S = 5.0
SETTLE_TIMEOUT_S = 30.0
SHORT_HANDSHAKE_MS = 1_000
CLOSED_WITHIN_S = 10.0
STORAGE = {0: STORAGE_CODEC}
# The first bytes of a TLS ClientHello record: a handshake begun and never finished.
PARTIAL_CLIENT_HELLO = bytes.fromhex("160301020001")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _use_node(node: StorageNodeProcess) -> None:
    """One append and one read through the data port: the code paths of a real client."""

    async def go() -> None:
        client = node.data_client()
        await client.open()
        try:
            max_txid = await client.max_transaction_id(-1, 0)
            first = max_txid + 1
            await client.append(-1, 0, make_records(first, 5, 0))
            assert await client.records(-1, 0, first, 5) == make_records(first, 5, 0)
        finally:
            await client.close()

    node.run(go())


def _idle(port: int, source: str = HOST) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    sock.bind((source, 0))
    sock.connect((HOST, port))
    return sock


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """True when the node closes ``sock`` (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


NodeFactory = Callable[[dict[str, object]], StorageNodeProcess]


@pytest.fixture
def node_factory(zookeeper: str, tmp_path: Path) -> Iterator[NodeFactory]:
    nodes: list[StorageNodeProcess] = []

    def make(extra: dict[str, object]) -> StorageNodeProcess:
        node = start_storage_node(
            zookeeper, tmp_path / f"node-{len(nodes)}", NUM_PARTITIONS, extra_config=extra
        )
        nodes.append(node)
        return node

    try:
        yield make
    finally:
        for node in nodes:
            node.close()


def test_idle_connection_flood_leaves_rss_near_baseline(node_factory: NodeFactory) -> None:
    # Caps above the flood: every connection is admitted and held, so what is measured is the
    # cost of an idle connection (asyncio's 256 KiB TLS read buffer each, kept by the allocator).
    node = node_factory(
        {
            "storage.max.connections.per.peer": 2 * FLOOD_CONNECTIONS,
            "storage.max.connections": 2 * FLOOD_CONNECTIONS,
            "storage.handshake.timeout.ms": 120_000,
        }
    )
    _use_node(node)
    time.sleep(0.5)
    baseline = _rss_mb(node.pid)
    # Connections that never send a byte, then ones that begin a TLS handshake and stall.
    for _round, first_bytes in enumerate((b"", PARTIAL_CLIENT_HELLO)):
        socks: list[socket.socket] = []
        try:
            for _ in range(FLOOD_CONNECTIONS):
                socks.append(_idle(node.port))
                if first_bytes:
                    socks[-1].sendall(first_bytes)
            time.sleep(2.0)
            assert node.running
            peak = _rss_mb(node.pid)
            print(f"round {_round}: baseline {baseline:.0f} MB, {peak:.0f} MB with {len(socks)} open")
        finally:
            for sock in socks:
                sock.close()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (rss := _rss_mb(node.pid)) > baseline + RSS_SLACK_MB and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"round {_round}: {rss:.0f} MB after they closed")
        assert rss <= baseline + RSS_SLACK_MB, (
            f"round {_round}: RSS {rss:.0f} MB after {FLOOD_CONNECTIONS} idle connections closed "
            f"(baseline {baseline:.0f} MB, {peak:.0f} MB while open)"
        )
    _use_node(node)
    log = node.log_text()
    silent = [line for line in log.splitlines() if "the peer sent nothing" in line]
    # One line per peer per interval, not one per connection.
    assert 1 <= len(silent) <= 2, silent


def test_handshake_time_limit_closes_a_connection_that_never_completes(node_factory: NodeFactory) -> None:
    node = node_factory({"storage.handshake.timeout.ms": SHORT_HANDSHAKE_MS})
    silent, partial = _idle(node.port), _idle(node.admin_port)
    try:
        partial.sendall(PARTIAL_CLIENT_HELLO)
        start = time.monotonic()
        assert _closed_by_peer(silent, CLOSED_WITHIN_S)
        assert _closed_by_peer(partial, CLOSED_WITHIN_S)
        elapsed = time.monotonic() - start
        assert SHORT_HANDSHAKE_MS / 1000 * 0.8 <= elapsed <= SHORT_HANDSHAKE_MS / 1000 + 3.0, elapsed
    finally:
        silent.close()
        partial.close()
    assert "TLS handshake failed: timeout" in node.log_text()
    _use_node(node)


def test_per_peer_and_per_node_caps_refuse_the_excess(node_factory: NodeFactory) -> None:
    per_peer, per_node, extra = 3, 5, 20
    node = node_factory(
        {
            "storage.max.connections.per.peer": per_peer,
            "storage.max.connections": per_node,
            "storage.handshake.timeout.ms": 60_000,
        }
    )
    # The start's own admin connections (from 127.0.0.1) count until the node has closed them.
    time.sleep(1.0)
    held = [_idle(node.port) for _ in range(per_peer)]
    try:
        # Beyond the peer's cap: closed at once, the held ones stay open.
        refused = [_idle(node.port) for _ in range(extra)]
        assert all(_closed_by_peer(sock, CLOSED_WITHIN_S) for sock in refused)
        for sock in refused:
            sock.close()
        assert not any(_closed_by_peer(sock, 0.5) for sock in held)
        # Another address has its own count; the node's cap counts both ports together.
        other = [_idle(node.admin_port, "127.0.0.2") for _ in range(per_node - per_peer)]
        held += other
        beyond_node = _idle(node.port, "127.0.0.3")
        assert _closed_by_peer(beyond_node, CLOSED_WITHIN_S)
        beyond_node.close()
        with pytest.raises((ConnectionClosedError, OSError)):
            _use_node(node)
    finally:
        for sock in held:
            sock.close()
    # The counts go down as connections close: a real client is served again.
    deadline = time.monotonic() + CLOSED_WITHIN_S
    while True:
        try:
            _use_node(node)
            break
        except (ConnectionClosedError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    refusals = [line for line in node.log_text().splitlines() if "refused connections from 127.0.0.1" in line]
    assert len(refusals) == 1, refusals  # one line per peer per interval, not one per connection
    assert f"limit {per_peer}" in refusals[0]


def test_bytes_buffered_per_connection_are_capped() -> None:
    cap = 4096

    async def go() -> None:
        ended: asyncio.Queue[BaseException | None] = asyncio.Queue()

        async def handler(conn: FramedConnection) -> None:
            try:
                while await conn.receive() is not None:
                    pass
                await ended.put(None)
            except BaseException as e:
                await ended.put(e)
                raise

        gate = ConnectionGate(ConnectionLimits(max_buffered_bytes=cap))
        listener = await serve(
            "127.0.0.1",
            0,
            server_context(TlsConfig()),
            STORAGE,
            "Waltz Storage Server",
            handler,
            "test",
            gate,
        )
        port = listener.sockets[0].getsockname()[1]
        try:
            conn = await connect("127.0.0.1", port, client_ssl(), STORAGE, "Waltz Storage Client")
            await conn.send(StorageOpenRequest(-1, -1, -1, uuid.UUID(int=7), 4))
            # A frame header announcing more than the cap: refused before its body is read.
            conn.send_frame(bytes([ord("S"), 0, 0]) + (cap * 4).to_bytes(4, "big") + bytes(cap * 4))
            with contextlib.suppress(ConnectionClosedError):
                await conn.drain()
            error = await asyncio.wait_for(ended.get(), CLOSED_WITHIN_S)
            assert error is not None and f"maximum of {cap - 7} bytes" in str(error), error
            await conn.close()
        finally:
            listener.close()
            await listener.end_connections(5.0)
            await listener.wait_closed()

    asyncio.run(go())


def test_limits_are_config_keys_on_both_node_kinds(tmp_path: Path) -> None:
    storage = minimal_storage_keys(tmp_path)
    server = {
        "server.port": 3,
        "zookeeper.connectString": "127.0.0.1:1",
        "zookeeper.sessionTimeout": 10_000,
        "cluster.root": "/c",
    }
    defaults = ConnectionLimits(
        HANDSHAKE_TIMEOUT_MS, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, MAX_BUFFERED_BYTES_PER_CONNECTION
    )
    assert StorageConfig.from_config(Config(storage)).connection_limits == defaults
    assert ServerConfig.from_config(Config(server)).connection_limits == defaults
    assert StorageConfig.from_config(
        Config(
            {
                **storage,
                "storage.handshake.timeout.ms": 1,
                "storage.max.connections": 2,
                "storage.max.connections.per.peer": 3,
                "storage.max.buffered.bytes.per.connection": 4000,
            }
        )
    ).connection_limits == ConnectionLimits(1, 2, 3, 4000)
    assert ServerConfig.from_config(
        Config(
            {
                **server,
                "server.handshakeTimeout": 1,
                "server.maxConnections": 2,
                "server.maxConnectionsPerPeer": 3,
                "server.maxBufferedBytesPerConnection": 4000,
            }
        )
    ).connection_limits == ConnectionLimits(1, 2, 3, 4000)
    with pytest.raises(ConfigError, match="storage.max.connections.per.peer"):
        StorageConfig.from_config(Config({**storage, "storage.max.connections.per.peer": 0}))
    with pytest.raises(ConfigError, match="server.maxBufferedBytesPerConnection"):
        ServerConfig.from_config(Config({**server, "server.maxBufferedBytesPerConnection": 5}))
