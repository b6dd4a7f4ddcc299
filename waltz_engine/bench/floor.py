"""The physical floor of a commit on this machine, measured now (issue 23, `waltz bench floor`).

A commit needs the client's append to reach the server, the server's batch to reach a quorum of
storage nodes and be on their disks (fdatasync), and the answers back: two round trips and one
quorum fsync. The floor measures each on the same disk and loopback the cluster uses, so a
latency report can be read against the machine it ran on (a noisy shared machine moves both):

- ``fsync_p50_ms``: a small ``pwrite`` + ``fdatasync`` on the storage directory's disk;
- ``quorum_fsync_p50_ms``: three such writes issued at once, each on its own file (three
  replicas on one disk), until the second is durable (a quorum of three);
- ``tls_round_trip_p50_ms``: a small message there and back over TLS between two processes;
- ``commit_floor_ms``: 2 round trips + the quorum fsync.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from waltz_engine.net.tls import TlsConfig, client_context, server_context

DEFAULT_SAMPLES = 200
MAX_SAMPLES = 100_000
RECORD_BYTES = 512  # one small transaction's record
MESSAGE_BYTES = 64  # one small request and its answer
QUORUM_REPLICAS = 3
QUORUM = QUORUM_REPLICAS // 2 + 1
ECHO_START_TIMEOUT_S = 30.0
ECHO_STOP_TIMEOUT_S = 10.0
LOOPBACK = "127.0.0.1"


class FloorError(Exception):
    """The floor could not be measured (a directory that cannot be written, no echo process)."""


@dataclass(frozen=True)
class Floor:
    directory: str
    samples: int
    fsync_p50_ms: float
    quorum_fsync_p50_ms: float
    tls_round_trip_p50_ms: float
    commit_floor_ms: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def measure(directory: Path, samples: int = DEFAULT_SAMPLES) -> Floor:
    """The floor on ``directory``'s disk and this machine's loopback (``samples`` of each)."""
    if not 1 <= samples <= MAX_SAMPLES:
        raise FloorError(f"samples must be 1..{MAX_SAMPLES}, not {samples}")
    if not directory.is_dir():
        raise FloorError(f"{directory} is not a directory; give the storage directory (or any on its disk)")
    try:
        with tempfile.TemporaryDirectory(prefix=".waltz-floor-", dir=directory) as scratch:
            fsync_ms = _fsync_samples(Path(scratch), samples)
            quorum_ms = _quorum_fsync_samples(Path(scratch), samples)
    except OSError as e:
        raise FloorError(f"cannot write in {directory}: {e.strerror or e}") from None
    round_trip_ms = asyncio.run(_tls_round_trips(samples))
    fsync = statistics.median(fsync_ms)
    quorum = statistics.median(quorum_ms)
    round_trip = statistics.median(round_trip_ms)
    return Floor(
        directory=str(directory),
        samples=samples,
        fsync_p50_ms=round(fsync, 3),
        quorum_fsync_p50_ms=round(quorum, 3),
        tls_round_trip_p50_ms=round(round_trip, 3),
        commit_floor_ms=round(2 * round_trip + quorum, 3),
    )


def _write_and_sync(fd: int, record: bytes, offset: int) -> None:
    os.pwrite(fd, record, offset)
    os.fdatasync(fd)


def _fsync_samples(scratch: Path, samples: int) -> list[float]:
    record = os.urandom(RECORD_BYTES)
    fd = os.open(scratch / "fsync", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        took_ms = []
        for i in range(samples):
            started = time.perf_counter()
            _write_and_sync(fd, record, i * RECORD_BYTES)
            took_ms.append((time.perf_counter() - started) * 1000.0)
        return took_ms
    finally:
        os.close(fd)


def _quorum_fsync_samples(scratch: Path, samples: int) -> list[float]:
    """Three writers on their own threads and files, released together; the second to finish."""
    record = os.urandom(RECORD_BYTES)
    fds = [os.open(scratch / f"replica-{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(QUORUM_REPLICAS)]
    start = threading.Barrier(QUORUM_REPLICAS + 1)
    done = threading.Barrier(QUORUM_REPLICAS + 1)
    finished: list[float] = []
    lock = threading.Lock()
    errors: list[OSError] = []

    def replica(fd: int) -> None:
        for i in range(samples):
            start.wait()
            try:
                _write_and_sync(fd, record, i * RECORD_BYTES)
            except OSError as e:
                errors.append(e)
            with lock:
                finished.append(time.perf_counter())
            done.wait()

    threads = [threading.Thread(target=replica, args=(fd,), daemon=True) for fd in fds]
    for thread in threads:
        thread.start()
    took_ms = []
    try:
        for _ in range(samples):
            with lock:
                finished.clear()
            start.wait()
            started = time.perf_counter()
            done.wait()
            took_ms.append((sorted(finished)[QUORUM - 1] - started) * 1000.0)
    finally:
        for thread in threads:
            thread.join()
        for fd in fds:
            os.close(fd)
    if errors:
        raise errors[0]
    return took_ms


async def _tls_round_trips(samples: int) -> list[float]:
    echo = subprocess.Popen(
        [sys.executable, "-m", "waltz_engine.bench.floor_echo"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert echo.stdout is not None
        async with asyncio.timeout(ECHO_START_TIMEOUT_S):
            port_line = await asyncio.to_thread(echo.stdout.readline)
        if not port_line.strip().isdigit():
            raise FloorError("the TLS echo process did not start (no port on its first line)")
        reader, writer = await asyncio.open_connection(
            LOOPBACK, int(port_line), ssl=client_context(TlsConfig()), server_hostname=LOOPBACK
        )
        message = os.urandom(MESSAGE_BYTES)
        took_ms = []
        for _ in range(samples):
            started = time.perf_counter()
            writer.write(message)
            await reader.readexactly(MESSAGE_BYTES)
            took_ms.append((time.perf_counter() - started) * 1000.0)
        writer.close()
        return took_ms
    finally:
        echo.terminate()
        try:
            echo.wait(ECHO_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()


async def serve_echo() -> None:
    """The other process: echoes every ``MESSAGE_BYTES`` over TLS; prints its port, then serves."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                writer.write(await reader.readexactly(MESSAGE_BYTES))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(echo, LOOPBACK, 0, ssl=server_context(TlsConfig()))
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()
