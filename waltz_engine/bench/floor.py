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

And the CPU floor of one request (issue 33), fixed by its definition so that improving the
product's transport does not move it:

- ``echo_cpu_us``: the CPU a bare server spends on one 64-byte TLS request and its 64-byte
  answer: a blocking ``ssl.SSLSocket`` on a thread of its own process, measured by that
  thread's clock (``time.thread_time``) after a warm-up;
- ``write_sync_cpu_us``: the CPU of one 600-byte ``pwrite`` + ``fdatasync`` (this thread's clock);
- ``request_cpu_floor_ms``: their sum, what one storage append request cannot cost less than
  in CPython here (a storage node's CPU per commit is read against twice it, a server's
  against four times it).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
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
SYNC_RECORD_BYTES = 600  # one small append request's bytes on disk
# Requests the CPU echo answers before its clock starts (the handshake, warm caches).
CPU_WARM_UP_REQUESTS = 50
# The CPU figures take this many times ``samples`` requests: a thread's clock is exact, but one
# request is tens of microseconds and a busy machine's preemptions add to few of them.
CPU_SAMPLES_FACTOR = 5
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
    echo_cpu_us: float
    write_sync_cpu_us: float
    request_cpu_floor_ms: float

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
            write_sync_cpu_s = _write_sync_cpu_s(Path(scratch), samples * CPU_SAMPLES_FACTOR)
    except OSError as e:
        raise FloorError(f"cannot write in {directory}: {e.strerror or e}") from None
    round_trip_ms = asyncio.run(_tls_round_trips(samples))
    echo_cpu_s = _blocking_echo_cpu_s(samples * CPU_SAMPLES_FACTOR)
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
        echo_cpu_us=round(echo_cpu_s * 1e6, 1),
        write_sync_cpu_us=round(write_sync_cpu_s * 1e6, 1),
        request_cpu_floor_ms=round((echo_cpu_s + write_sync_cpu_s) * 1000, 4),
    )


def _write_sync_cpu_s(scratch: Path, samples: int) -> float:
    """CPU seconds of one ``SYNC_RECORD_BYTES`` pwrite + fdatasync (this thread's clock)."""
    record = os.urandom(SYNC_RECORD_BYTES)
    fd = os.open(scratch / "cpu", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        started = time.thread_time()
        for i in range(samples):
            _write_and_sync(fd, record, i * SYNC_RECORD_BYTES)
        return (time.thread_time() - started) / samples
    finally:
        os.close(fd)


def _blocking_echo_cpu_s(samples: int) -> float:
    """CPU seconds the blocking-thread echo process spends on one request (its thread's clock)."""
    echo = subprocess.Popen(
        [sys.executable, "-m", "waltz_engine.bench.floor_echo", "blocking", str(CPU_WARM_UP_REQUESTS)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert echo.stdout is not None
        port_line = echo.stdout.readline()
        if not port_line.strip().isdigit():
            raise FloorError("the blocking TLS echo process did not start (no port on its first line)")
        raw = socket.create_connection((LOOPBACK, int(port_line)), timeout=ECHO_START_TIMEOUT_S)
        with client_context(TlsConfig()).wrap_socket(raw, server_hostname=LOOPBACK) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            message = os.urandom(MESSAGE_BYTES)
            for _ in range(CPU_WARM_UP_REQUESTS + samples):
                sock.sendall(message)
                _receive_exactly(sock, MESSAGE_BYTES)
        cpu_line = echo.stdout.readline().split()
        if len(cpu_line) != 2 or int(cpu_line[1]) != samples:
            raise FloorError(f"the blocking TLS echo process answered {cpu_line!r}, not its CPU time")
        return int(cpu_line[0]) / 1e9 / samples
    finally:
        _stop(echo)


def _stop(echo: subprocess.Popen[str]) -> None:
    echo.terminate()
    try:
        echo.wait(ECHO_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        echo.kill()
        echo.wait()


def _receive_exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise FloorError("the TLS echo closed the connection")
        data += chunk
    return data


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
        _stop(echo)


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


def serve_blocking_echo(warm_up_requests: int) -> None:
    """The CPU floor's other process: one TLS connection on a thread with a blocking socket;
    prints its port, then, when the client closes, the thread's CPU nanoseconds over the requests
    after the first ``warm_up_requests`` and how many they were."""
    listener = socket.create_server((LOOPBACK, 0))
    print(listener.getsockname()[1], flush=True)
    result: list[int] = []

    def serve() -> None:
        raw, _ = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with server_context(TlsConfig()).wrap_socket(raw, server_side=True) as sock:
            answered = 0
            started_ns = 0
            while True:
                try:
                    message = _receive_exactly(sock, MESSAGE_BYTES)
                except (FloorError, OSError):
                    break
                sock.sendall(message)
                answered += 1
                if answered == warm_up_requests:
                    started_ns = time.thread_time_ns()
            result.extend((time.thread_time_ns() - started_ns, answered - warm_up_requests))

    thread = threading.Thread(target=serve, name="blocking-echo")
    thread.start()
    thread.join()
    print(*result, flush=True)
