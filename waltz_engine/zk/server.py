"""An embedded, standalone ZooKeeper run from the jars that ship inside pyspark (the ``[spark]``
extra) or, without it, from the system's ZooKeeper package (Debian's ``libzookeeper-java``).

Everything about one instance lives in its data directory: ``zoo.cfg`` (so ``stop``/``status``
only need the directory), ``zookeeper.pid``, ``zookeeper.log`` and ZooKeeper's own snapshots.
Readiness and status use the ``ruok``/``srvr`` four-letter words on the client port.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

from waltz_engine.common.address import port_in_use
from waltz_engine.common.config import DEV_CLUSTER_DIRECTORY
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.extras import SPARK, install_hint

ZOOKEEPER_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEFAULT_PORT = 2181
DEFAULT_ADDRESS = "127.0.0.1"
TICK_TIME_MS = 2000
JVM_MAX_HEAP = "512m"
# The embedded ZooKeeper serves metadata only: the client compiler alone and the serial
# collector start it with about half the CPU (1.6-1.9 s against 2.9-3.1 s, measured), which a
# dev cluster and every test session pay.
JVM_LEAN_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
START_TIMEOUT_MS = 30_000
STOP_TIMEOUT_MS = 10_000
PROBE_TIMEOUT_MS = 3_000  # a JVM on a busy machine can take seconds to answer `srvr`
POLL_INTERVAL_MS = 100
PROBE_REPLY_MAX_SIZE_BYTES = 4096
# Debian's libzookeeper-java (and libslf4j-java, which it depends on): the server, its
# serialization, and one SLF4J binding that logs to stderr (the log file).
SYSTEM_JAVA_DIR = Path("/usr/share/java")
SYSTEM_ZOOKEEPER_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar")

# Where `waltz zk start` keeps its ZooKeeper unless told; `waltz dev up` keeps the dev
# cluster's in DEV_DATA_DIR (devcluster.DEFAULT_DIRECTORY / devcluster.ZOOKEEPER_DIR_NAME).
DEFAULT_DATA_DIR = Path(".waltz/zookeeper")
DEV_DATA_DIR = Path(DEV_CLUSTER_DIRECTORY) / "zookeeper"

CONFIG_FILE_NAME = "zoo.cfg"
PID_FILE_NAME = "zookeeper.pid"
LOG_FILE_NAME = "zookeeper.log"
LOG4J_FILE_NAME = "log4j2.properties"

_LOG4J_CONFIG = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1} - %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""

# Processes started by this Python process, so that stopping one also reaps it (a zombie
# would otherwise still look alive) and dropping the handle does not warn.
_STARTED: dict[int, subprocess.Popen[bytes]] = {}


class EmbeddedZooKeeperError(WaltzError):
    """The embedded ZooKeeper cannot be started, stopped or inspected."""


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise EmbeddedZooKeeperError(
            "java not found: install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`) "
            "or set JAVA_HOME"
        )
    return found


def _pyspark_classpath() -> str | None:
    """``<pyspark>/jars/*``: pyspark bundles the ZooKeeper server and everything it needs."""
    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        return None
    jars = Path(found.origin).resolve().parent / "jars"
    return f"{jars}/*" if any(jars.glob("zookeeper-*.jar")) else None


def system_classpath() -> str | None:
    """The system package's jars, named one by one: the directory also holds other SLF4J
    bindings, and a wildcard would load whichever comes first."""
    jars = [SYSTEM_JAVA_DIR / name for name in SYSTEM_ZOOKEEPER_JARS]
    return os.pathsep.join(str(jar) for jar in jars) if all(jar.is_file() for jar in jars) else None


def zookeeper_classpath() -> str:
    """pyspark's jars when it is installed, else the system package's."""
    classpath = _pyspark_classpath() or system_classpath()
    if classpath is None:
        raise EmbeddedZooKeeperError(
            "no ZooKeeper jars found: install the system package (`apt-get install libzookeeper-java`) "
            f"or the Spark extra ({install_hint(SPARK)})"
        )
    return classpath


class ServerStatus(NamedTuple):
    running: bool
    pid: int | None
    address: str
    port: int
    data_dir: str
    version: str | None  # from `srvr`, when the server answers
    mode: str | None

    @property
    def connect_string(self) -> str:
        return f"{self.address}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "pid": self.pid,
            "connect_string": self.connect_string,
            "data_dir": self.data_dir,
            "version": self.version,
            "mode": self.mode,
        }


def four_letter_word(address: str, port: int, word: str, timeout_ms: int = PROBE_TIMEOUT_MS) -> str | None:
    """The server's reply to a four-letter command, or None when nothing answers."""
    assert len(word) == 4
    try:
        with socket.create_connection((address, port), timeout=timeout_ms / 1000) as sock:
            sock.sendall(word.encode("ascii"))
            reply = b""
            while len(reply) < PROBE_REPLY_MAX_SIZE_BYTES:
                chunk = sock.recv(PROBE_REPLY_MAX_SIZE_BYTES)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return None
    return reply.decode("utf-8", "replace")


def _port_is_free(address: str, port: int) -> bool:
    try:
        return not port_in_use(address, port)
    except OSError as e:
        raise EmbeddedZooKeeperError(f"cannot bind {address}:{port}: {e.strerror}") from None


def _process_alive(pid: int) -> bool:
    child = _STARTED.get(pid)
    if child is not None:
        return child.poll() is None
    proc = Path(f"/proc/{pid}")
    if proc.parent.is_dir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        # Guard against a recycled pid, and treat a zombie as gone.
        return ZOOKEEPER_MAIN_CLASS.encode() in cmdline and state != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedZooKeeper:
    """One standalone ZooKeeper bound to ``address:port`` with its state in ``data_dir``.

    ``port=None`` takes the port from an existing ``zoo.cfg`` in ``data_dir`` (what ``stop`` and
    ``status`` need), else :data:`DEFAULT_PORT`.
    """

    def __init__(self, data_dir: Path | str, port: int | None = None, address: str = DEFAULT_ADDRESS) -> None:
        self.data_dir = Path(data_dir).resolve()
        configured = self._configured_port()
        self.port = port if port is not None else (configured if configured is not None else DEFAULT_PORT)
        if not 0 < self.port < 65536:
            raise EmbeddedZooKeeperError(f"port must be in 1..65535, got {self.port}")
        self.address = address

    @property
    def connect_string(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / CONFIG_FILE_NAME

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE_NAME

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE_NAME

    def _configured_port(self) -> int | None:
        try:
            lines = self.config_file.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "clientPort" and value.strip().isdigit():
                return int(value.strip())
        return None

    def pid(self) -> int | None:
        """The pid of the running server, or None (a stale pid file is removed)."""
        try:
            text = self.pid_file.read_text(encoding="ascii").strip()
        except OSError:
            return None
        if text.isdigit() and _process_alive(int(text)):
            return int(text)
        self.pid_file.unlink(missing_ok=True)
        return None

    def is_running(self) -> bool:
        return self.pid() is not None

    def is_serving(self) -> bool:
        return four_letter_word(self.address, self.port, "ruok") == "imok"

    def status(self) -> ServerStatus:
        pid = self.pid()
        version = mode = None
        reply = four_letter_word(self.address, self.port, "srvr") if pid is not None else None
        for line in (reply or "").splitlines():
            key, _, value = line.partition(":")
            if key == "Zookeeper version":
                version = value.strip().split(",")[0]
            elif key == "Mode":
                mode = value.strip()
        return ServerStatus(pid is not None, pid, self.address, self.port, str(self.data_dir), version, mode)

    def _write_config(self) -> None:
        self.config_file.write_text(
            "\n".join(
                (
                    f"tickTime={TICK_TIME_MS}",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.address}",
                    # Every Waltz process of a local cluster connects from the same address.
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr",
                    "",
                )
            ),
            encoding="utf-8",
        )
        (self.data_dir / LOG4J_FILE_NAME).write_text(_LOG4J_CONFIG, encoding="utf-8")

    def start(self, wait_timeout_ms: int = START_TIMEOUT_MS) -> int:
        """Launch the server detached (own session) and return its pid once it answers ``ruok``."""
        assert wait_timeout_ms > 0
        running = self.pid()
        if running is not None:
            raise EmbeddedZooKeeperError(
                f"ZooKeeper is already running from {self.data_dir} (pid {running}, port {self.port})"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not _port_is_free(self.address, self.port):
            raise EmbeddedZooKeeperError(f"port {self.port} on {self.address} is already in use")
        command = [
            find_java(),
            f"-Xmx{JVM_MAX_HEAP}",
            *JVM_LEAN_FLAGS,
            f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_FILE_NAME}",
            "-cp",
            zookeeper_classpath(),
            ZOOKEEPER_MAIN_CLASS,
            str(self.config_file),
        ]
        self._write_config()
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # Ctrl-C in our terminal must not reach it directly
            )
        _STARTED[process.pid] = process
        self.pid_file.write_text(f"{process.pid}\n", encoding="ascii")
        self._await_ready(process, wait_timeout_ms)
        return process.pid

    def _await_ready(self, process: subprocess.Popen[bytes], wait_timeout_ms: int) -> None:
        deadline = time.monotonic() + wait_timeout_ms / 1000
        while not self.is_serving():
            if process.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise EmbeddedZooKeeperError(
                    f"ZooKeeper exited during startup (exit code {process.returncode}); {self._last_error()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedZooKeeperError(
                    f"ZooKeeper did not answer on {self.connect_string} within {wait_timeout_ms} ms; "
                    f"see {self.log_file}"
                )
            time.sleep(POLL_INTERVAL_MS / 1000)

    def _last_error(self) -> str:
        try:
            lines = self.log_file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return f"see {self.log_file}"
        errors = [line for line in lines if " ERROR " in line or "Exception" in line]
        return f"{errors[0].strip()} (see {self.log_file})" if errors else f"see {self.log_file}"

    def wait(self) -> int:
        """Block until a server started by this process exits; returns its exit code."""
        pid = self.pid()
        if pid is None or pid not in _STARTED:
            raise EmbeddedZooKeeperError(f"no ZooKeeper started by this process runs from {self.data_dir}")
        code = _STARTED[pid].wait()
        self._forget(pid)
        return code

    def stop(self, timeout_ms: int = STOP_TIMEOUT_MS) -> bool:
        """SIGTERM, then SIGKILL after ``timeout_ms``; False when nothing was running."""
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_ms / 1000
        while _process_alive(pid) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_MS / 1000)
        if _process_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child = _STARTED.get(pid)
        if child is not None:
            child.wait(timeout=timeout_ms / 1000)
        self._forget(pid)
        return True

    def _forget(self, pid: int) -> None:
        _STARTED.pop(pid, None)
        self.pid_file.unlink(missing_ok=True)


def find_data_dir(candidates: tuple[Path, ...] = (DEFAULT_DATA_DIR, DEV_DATA_DIR)) -> Path:
    """Where `zk stop`/`zk status` look when given no directory: the first candidate whose
    ZooKeeper runs, else the first that holds one (a ``zoo.cfg``), else the first."""
    for candidate in candidates:
        if EmbeddedZooKeeper(candidate).is_running():
            return candidate
    for candidate in candidates:
        if (candidate / CONFIG_FILE_NAME).is_file():
            return candidate
    return candidates[0]
