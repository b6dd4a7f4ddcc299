"""One node of a local cluster (a storage node or a server) as a detached process: start,
stop, kill, pause, status, and the ports and probes they share.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from waltz_engine.common.address import port_in_use
from waltz_engine.common.config import DEV_CLIENT_CONFIG_NAME, DEV_CLUSTER_DIRECTORY
from waltz_engine.common.errors import WaltzError

HOST = "127.0.0.1"
STATE_FILE_NAME = "devcluster.json"
CLIENT_CONFIG_FILE_NAME = DEV_CLIENT_CONFIG_NAME
ZOOKEEPER_DIR_NAME = "zookeeper"
DEFAULT_DIRECTORY = DEV_CLUSTER_DIRECTORY
DEFAULT_CLUSTER_ROOT = "/waltz_cluster"  # as bin/test-cluster.sh
DEFAULT_CLUSTER_NAME = "waltz-dev"
DEFAULT_STORAGES = 3
DEFAULT_SERVERS = 1
DEFAULT_PARTITIONS = 4
STORAGE_GROUP = 0  # test-cluster.sh: `add-storage-node -g 0`; every node holds every partition
STATE_VERSION = 1

DEFAULT_WAIT_TIMEOUT_MS = 120_000
NODE_STOP_TIMEOUT_MS = 30_000
ZK_SESSION_TIMEOUT_MS = 10_000
ZK_CONNECT_TIMEOUT_MS = 10_000
VERIFY_RPC_TIMEOUT_S = 5
ADMIN_TIMEOUT_MS = 10_000
HEALTH_HTTP_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.1
VERIFY_RETRY_INTERVAL_S = 0.5
LOG_TAIL_LINES = 20
# Short store retries: a local cluster is restarted often and should heal in seconds, not in
# the original's 20 s backoff cap.
SERVER_STORAGE_INITIAL_RETRY_MS = 50
SERVER_STORAGE_MAX_RETRY_MS = 1_000

# Listening ports are picked at random from [LISTEN_PORTS_FLOOR, the ephemeral range's start)
# when that holds at least ENOUGH_LISTEN_PORTS (see free_port).
LISTEN_PORTS_FLOOR = 10_000
ENOUGH_LISTEN_PORTS = 1_000
LISTEN_PORT_TRIES = 100
PORT_RANGE_ENV = "WALTZ_PORT_RANGE"
MAX_PORT = 65_536
EPHEMERAL_PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_port_pick = random.SystemRandom()  # not the seedable module RNG: parallel runs must not agree
# The ports this process handed out lately (bounded): never handed out twice in a row.
HANDED_OUT_PORTS_KEPT = 4096
_handed_out: collections.deque[int] = collections.deque(maxlen=HANDED_OUT_PORTS_KEPT)
STORAGE_DATA_DIR_NAME = "data"  # under the node's directory
PORTS_PER_STORAGE = 3  # data, admin, http
PORTS_PER_SERVER = 2  # client, http
# What each port of a node is, in words (for "port N (storage-0 admin port) is in use").
PORT_WORDS = {
    "storage": {"port": "data port", "admin_port": "admin port", "jetty_port": "HTTP port"},
    "server": {"port": "client port", "jetty_port": "HTTP port"},
}

STORAGE = "storage"
SERVER = "server"
# The engine's entry point of each kind of node (what `waltz storage|server start` runs).
_NODE_MODULE = {STORAGE: "waltz_engine.storage", SERVER: "waltz_engine.server"}
# The line each node logs once it serves (storage/node/node.py, server/server.py).
_READY_MARKER = {STORAGE: "storage node ready:", SERVER: " ready: cluster "}


class NodeProcess(Protocol):
    """A node process as its launcher hands it back (``subprocess.Popen`` is one)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


# (module, args, working directory, log file) -> the started process: `python -m MODULE ARGS`
# in a session of its own, stdin empty, stdout and stderr appended to the log. The one way nodes
# start; tests swap in one that forks from a warm parent (the imports a cold start pays).
NodeLauncher = Callable[[str, Sequence[str], Path, Path], NodeProcess]


def launch_node_process(module: str, args: Sequence[str], cwd: Path, log_path: Path) -> NodeProcess:
    """The default :data:`NodeLauncher`: a new Python interpreter."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )


# Children started by this Python process: reaped when stopped so that they do not linger as
# zombies (a zombie would still look alive through /proc).
_CHILDREN: dict[int, NodeProcess] = {}


class DevClusterError(WaltzError):
    """The local cluster cannot be brought up, inspected or stopped; one line for a person."""


def free_port() -> int:
    """A port nothing listens on right now, below the kernel's ephemeral range when it is known.

    A port that bind(0) picks comes from the ephemeral range, where any process's outgoing
    connection can take it before the node meant to listen on it starts (seen under load: a
    storage node exiting with "cannot listen on 127.0.0.1:45129 ('storage.port'): address
    already in use"). Below that range only listeners take ports.
    """
    chosen = port_range()
    span = chosen
    floor = _ephemeral_floor()
    if span is None and floor is not None and floor - LISTEN_PORTS_FLOOR >= ENOUGH_LISTEN_PORTS:
        span = (LISTEN_PORTS_FLOOR, floor)
    if span is not None:
        for _ in range(LISTEN_PORT_TRIES):
            port = _port_pick.randrange(*span)
            if port not in _handed_out and _port_free(port):
                return _hand_out(port)
    if chosen is not None:
        raise DevClusterError(f"no free port in {PORT_RANGE_ENV}={chosen[0]}-{chosen[1]}: widen it")
    for _ in range(LISTEN_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            picked: int = sock.getsockname()[1]
        if picked not in _handed_out:
            return _hand_out(picked)
    raise DevClusterError(f"no free port found in {LISTEN_PORT_TRIES} tries")


def _hand_out(port: int) -> int:
    """Nothing listens on a port just picked: the same process must not pick it again before its
    node binds it (two ports of one node's config came out equal once)."""
    _handed_out.append(port)
    return port


def port_range(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """``WALTZ_PORT_RANGE=LOW-HIGH`` (HIGH excluded): where free ports are picked, so that
    processes that pick at once (parallel test workers, several dev clusters) never pick alike."""
    text = environ.get(PORT_RANGE_ENV)
    if not text:
        return None
    low_text, _, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low = high = 0
    if not 0 < low < high <= MAX_PORT:
        raise DevClusterError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH, e.g. 20000-25000")
    return low, high


def _ephemeral_floor() -> int | None:
    try:
        text = Path(EPHEMERAL_PORT_RANGE_FILE).read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _pid_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process whose command line contains ``marker``.

    The marker (the node's config path) guards against a recycled pid; a zombie counts as dead.
    """
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes()
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return marker.encode() in cmdline and state != "Z"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _last_error(path: Path) -> str:
    """The line of a node's log that says why it stopped, as one line."""
    lines = [line.strip() for line in _tail(path).splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:") or "Error" in line or "ERROR" in line:
            return line
    return lines[-1] if lines else "no log"


def port_taken(port: int) -> bool:
    try:
        return port_in_use(HOST, port)
    except OSError as e:
        raise DevClusterError(f"cannot bind {HOST}:{port}: {e.strerror}") from None


def accepts_connections(host_port: str) -> bool:
    """Whether something accepts TCP connections at ``HOST:PORT``."""
    host, _, port = host_port.strip().rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=HEALTH_HTTP_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def _http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=HEALTH_HTTP_TIMEOUT_S) as r:
            status: int = r.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, TimeoutError):
        return None


class NodeStatus(NamedTuple):
    name: str
    kind: str
    pid: int | None
    running: bool
    healthy: bool
    ports: dict[str, int]
    log: str
    data_dir: str | None = None  # a storage node's storage directory (storage.directory)

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


@dataclass
class LocalNode:
    """One storage node or server process of a :class:`LocalCluster`."""

    kind: str
    index: int
    cluster_dir: Path
    ports: dict[str, int]
    pid: int | None = None
    on_change: Callable[[], None] = field(default=lambda: None, repr=False)
    launcher: NodeLauncher = field(default=launch_node_process, repr=False)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def directory(self) -> Path:
        return self.cluster_dir / self.name

    @property
    def config_path(self) -> Path:
        return self.directory / f"{self.kind}.yml"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.kind}.log"

    @property
    def port(self) -> int:
        """The data port (storage) or client port (server)."""
        return self.ports["port"]

    @property
    def jetty_port(self) -> int:
        return self.ports["jetty_port"]

    @property
    def admin_port(self) -> int:
        assert self.kind == STORAGE, "only storage nodes have an admin port"
        return self.ports["admin_port"]

    @property
    def connect_string(self) -> str:
        return f"{HOST}:{self.port}"

    def is_running(self) -> bool:
        return self.pid is not None and _pid_alive(self.pid, str(self.config_path))

    def is_healthy(self) -> bool:
        return self.is_running() and _http_status(self.jetty_port, "/health") == 200

    def status(self) -> NodeStatus:
        running = self.is_running()
        healthy = running and _http_status(self.jetty_port, "/health") == 200
        return NodeStatus(
            self.name,
            self.kind,
            self.pid if running else None,
            running,
            healthy,
            dict(self.ports),
            str(self.log_path),
            str(self.data_directory) if self.kind == "storage" else None,
        )

    @property
    def data_directory(self) -> Path:
        """Where a storage node keeps its control file and partitions (its storage.directory)."""
        return self.directory / STORAGE_DATA_DIR_NAME

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    # --- lifecycle -----------------------------------------------------------------------

    def start(self, wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS) -> None:
        """Launch the node (detached) and wait until it logs that it serves."""
        self.await_ready(self.launch(), wait_timeout_ms)

    def launch(self) -> int:
        """Start the process (detached); returns the log offset :meth:`await_ready` needs."""
        if self.is_running():
            raise DevClusterError(f"{self.name} is already running (pid {self.pid})")
        self.directory.mkdir(parents=True, exist_ok=True)
        # Only a ready line written after this offset counts: the log survives restarts.
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        process = self.launcher(
            _NODE_MODULE[self.kind], ["--config", str(self.config_path)], self.directory, self.log_path
        )
        _CHILDREN[process.pid] = process
        self.pid = process.pid
        self.on_change()
        return offset

    def await_ready(self, log_offset: int, wait_timeout_ms: int) -> None:
        """Until the node logs (after ``log_offset``) that it serves; raises if it exits."""
        assert wait_timeout_ms > 0
        deadline = time.monotonic() + wait_timeout_ms / 1000
        marker = _READY_MARKER[self.kind].encode()
        while True:
            with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
                log.seek(log_offset)  # (a launcher may hand back the process before its log exists)
                if marker in log.read():
                    return
            if not self.is_running():
                raise DevClusterError(
                    f"{self.name} exited during startup: {_last_error(self.log_path)} (log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise DevClusterError(f"{self.name} not ready in time; see {self.log_path}")
            time.sleep(POLL_INTERVAL_S)

    def _signal(self, sig: signal.Signals) -> bool:
        if not self.is_running():
            return False
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)
        return True

    def _await_exit(self, timeout_ms: int) -> bool:
        deadline = time.monotonic() + timeout_ms / 1000
        while self.is_running():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_INTERVAL_S)
        self._forget()
        return True

    def _forget(self) -> None:
        if self.pid is not None:
            child = _CHILDREN.pop(self.pid, None)
            if child is not None:
                child.wait(timeout=NODE_STOP_TIMEOUT_MS / 1000)
        self.pid = None
        self.on_change()

    def stop(self, timeout_ms: int = NODE_STOP_TIMEOUT_MS) -> bool:
        """SIGTERM (a paused node is resumed first), SIGKILL after ``timeout_ms``.

        False when it was not running.
        """
        if not self._signal(signal.SIGTERM):
            self._forget()
            return False
        self._signal(signal.SIGCONT)  # a stopped process would never act on SIGTERM
        if not self._await_exit(timeout_ms):
            self.kill()
        return True

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed or closed) and reap."""
        self._signal(signal.SIGKILL)
        if not self._await_exit(NODE_STOP_TIMEOUT_MS):
            raise DevClusterError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def restart(self, wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS) -> None:
        self.stop()
        self.start(wait_timeout_ms)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets but answers nothing (a hung node)."""
        if not self._signal(signal.SIGSTOP):
            raise DevClusterError(f"{self.name} is not running")

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if not self._signal(signal.SIGCONT):
            raise DevClusterError(f"{self.name} is not running")
