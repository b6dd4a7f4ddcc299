"""Bad bytes on every port close only that connection, with a logged reason; the node keeps
serving, and nothing on disk changes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import ssl
import struct
import urllib.request
from collections.abc import Iterator

import pytest
from storage_node_support import (
    StorageNodeProcess,
    client_ssl,
    directory_digest,
    make_records,
    start_storage_node,
)

from waltz_engine.wire.hello import (
    HELLO_CODEC,
    STORAGE_ADMIN_CLIENT_HELLO_TEXT,
    STORAGE_CLIENT_HELLO_TEXT,
    Hello,
)

EOF_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 10.0
FRAME_HEADER = struct.Struct(">Bhi")
NUM_PARTITIONS = 2


@pytest.fixture(scope="module")
def node(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNodeProcess]:
    node = start_storage_node(zookeeper, tmp_path_factory.mktemp("bad-input"), NUM_PARTITIONS)

    async def seed() -> None:
        client = node.data_client()
        await client.open()
        await client.append(-1, 0, make_records(0, 20, 0))
        await client.close()

    node.run(seed())
    try:
        yield node
    finally:
        assert node.terminate() == 0, node.log_text()


async def _exchange(
    port: int, payload: bytes, *, tls: bool, hello_text: str | None, close_after: bool
) -> bool:
    """Send ``payload`` (after a Hello if ``hello_text``); True when the node then closed on us."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl() if tls else None)
    try:
        if hello_text is not None:
            writer.write(HELLO_CODEC.encode_frame(Hello((0,), hello_text)))
        writer.write(payload)
        await writer.drain()
        if close_after:
            return False
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while await asyncio.wait_for(reader.read(65536), EOF_TIMEOUT_S):
                pass
        return True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), EOF_TIMEOUT_S)


def _cases(magic: int, hello_text: str) -> list[tuple[str, bytes, bool, str | None, bool]]:
    """(name, bytes, tls, hello text, close after sending instead of waiting for the node)."""
    rand = os.urandom(512)
    return [
        ("plain tcp random bytes", rand, False, None, False),
        ("tls random bytes instead of hello", rand, True, None, False),
        (
            "tls storage frame before hello",
            FRAME_HEADER.pack(magic, 0, 5) + b"\x0d" + bytes(4),
            True,
            None,
            False,
        ),
        ("wrong magic", FRAME_HEADER.pack(0x58, 0, 4) + bytes(4), True, hello_text, False),
        ("wrong version", FRAME_HEADER.pack(magic, 9, 4) + bytes(4), True, hello_text, False),
        ("oversize length", FRAME_HEADER.pack(magic, 0, 0x7FFFFFFF), True, hello_text, False),
        ("negative length", FRAME_HEADER.pack(magic, 0, -5), True, hello_text, False),
        ("garbage body", FRAME_HEADER.pack(magic, 0, len(rand)) + rand, True, hello_text, False),
        ("unknown type", FRAME_HEADER.pack(magic, 0, 3) + b"\x7f\x00\x00", True, hello_text, False),
        ("truncated body", FRAME_HEADER.pack(magic, 0, 4) + b"\x0d\x00\x00\x00", True, hello_text, False),
        ("truncated frame", FRAME_HEADER.pack(magic, 0, 100) + bytes(10), True, hello_text, True),
        ("second hello", HELLO_CODEC.encode_frame(Hello((0,), hello_text)), True, hello_text, False),
    ]


async def _healthy(node: StorageNodeProcess) -> None:
    client, admin = node.data_client(), node.admin_client()
    await client.open()
    await admin.open()
    try:
        assert await client.records(-1, 0, 0, 100) == make_records(0, 20, 0)
        assert await admin.assigned_partition_status() == {0: True, 1: True}
    finally:
        await client.close()
        await admin.close()


@pytest.mark.parametrize("port_kind", ["data", "admin"])
def test_bad_frames_close_only_that_connection(node: StorageNodeProcess, port_kind: str) -> None:
    port, magic, hello = (
        (node.port, ord("S"), STORAGE_CLIENT_HELLO_TEXT)
        if port_kind == "data"
        else (node.admin_port, ord("A"), STORAGE_ADMIN_CLIENT_HELLO_TEXT)
    )
    before = directory_digest(node.directory)
    log_before = len(node.log_text().splitlines())

    async def go() -> None:
        for name, payload, tls, hello_text, close_after in _cases(magic, hello):
            closed = await _exchange(port, payload, tls=tls, hello_text=hello_text, close_after=close_after)
            assert closed or close_after, name
            await _healthy(node)

    node.run(go())
    assert node.running
    new_log = "\n".join(node.log_text().splitlines()[log_before:])
    name = f"storage {port_kind} port"
    logged = re.compile(
        rf"{name}: (closed connection from \S+( during handshake)?|connection from \S+ ended): .+"
    )
    reasons = [line for line in new_log.splitlines() if logged.search(line)]
    # Every case logs its reason: plain TCP bytes as a failed TLS handshake, the others as the
    # frame or message defect (the truncated frame as a truncated stream).
    assert len(reasons) == len(_cases(magic, hello)), new_log
    assert any("TLS handshake failed" in line for line in reasons), new_log
    assert directory_digest(node.directory) == before


def _http(node: StorageNodeProcess, path: str) -> tuple[int, bytes]:
    assert node.jetty_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{node.jetty_port}{path}", timeout=HTTP_TIMEOUT_S) as r:
        return r.status, r.read()


def test_bad_http_requests(node: StorageNodeProcess) -> None:
    assert node.jetty_port is not None
    before = directory_digest(node.directory)
    bad = [
        os.urandom(300) + b"\r\n\r\n",
        b"GET /" + b"a" * 20_000,
        b"GET /ping\r\n\r\n",
        b"POST /x HTTP/1.1\r\n\r\n",
    ]
    for payload in bad:
        with socket.create_connection(("127.0.0.1", node.jetty_port), timeout=HTTP_TIMEOUT_S) as sock:
            sock.sendall(payload)
            with contextlib.suppress(ConnectionError):
                while sock.recv(65536):
                    pass  # read until the node closes (bounded by the socket timeout)
        assert _http(node, "/ping") == (200, b"pong\n")
    with socket.create_connection(("127.0.0.1", node.jetty_port), timeout=HTTP_TIMEOUT_S) as sock:
        sock.sendall(b"GET /pi")  # truncated request, then we go away
    node.run(_healthy(node))
    assert directory_digest(node.directory) == before
