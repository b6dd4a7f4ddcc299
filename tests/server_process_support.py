"""Run real `waltz server start --config FILE` processes for tests (bounded waits throughout)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from testkit import free_tcp_port
from zygote import ForkedProcess, launch_forked_node

SERVER_READY_TIMEOUT_S = 60.0
SERVER_EXIT_TIMEOUT_S = 30.0
READY_POLL_INTERVAL_S = 0.1
HTTP_TIMEOUT_S = 5.0
ZK_SESSION_TIMEOUT_MS = 10_000
HOST = "127.0.0.1"

# The `server` group lives in waltz_cli.commands.server; run it directly so the tests do not
# depend on its registration in waltz_cli.main.
_SERVER_MAIN = "import sys; from waltz_cli.commands.server import app; sys.argv[0] = 'waltz server'; app()"


class ServerProcess:
    def __init__(
        self, zookeeper: str, cluster_root: str, work_dir: Path, extra_config: dict[str, Any] | None = None
    ) -> None:
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_tcp_port()
        self.jetty_port = free_tcp_port()
        self.config_path = self.work_dir / "server.yml"
        self.log_path = self.work_dir / "server.log"
        config: dict[str, Any] = {
            "zookeeper.connectString": zookeeper,
            "zookeeper.sessionTimeout": ZK_SESSION_TIMEOUT_MS,
            "cluster.root": cluster_root,
            "server.host": HOST,
            "server.advertisedHost": HOST,
            "server.port": self.port,
            "server.jetty.port": self.jetty_port,
            "storage.initialRetryInterval": 50,
            "storage.maxRetryInterval": 500,
        }
        config.update(extra_config or {})
        self.config_path.write_text(yaml.safe_dump(config))
        self.process: ForkedProcess | None = None

    def start(self, wait: bool = True) -> ServerProcess:
        # What `waltz server start` runs, forked from a warm parent (tests/zygote.py).
        self.process = launch_forked_node(
            "waltz_engine.server", ["--config", str(self.config_path)], self.work_dir, self.log_path
        )
        if wait:
            self.wait_ready()
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def http_get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                f"http://{HOST}:{self.jetty_port}{path}", timeout=HTTP_TIMEOUT_S
            ) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_ready(self, timeout_s: float = SERVER_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log_text()}")
            if "ready:" in self.log_text():
                return
            time.sleep(READY_POLL_INTERVAL_S)
        raise AssertionError(f"server not ready within {timeout_s} s:\n{self.log_text()}")

    def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(SERVER_EXIT_TIMEOUT_S)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(SERVER_EXIT_TIMEOUT_S)


def run_server_to_exit(
    config_path: Path, timeout_s: float = SERVER_EXIT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SERVER_MAIN, "start", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
