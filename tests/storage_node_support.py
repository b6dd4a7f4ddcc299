"""Run real storage nodes (`waltz storage start --config FILE`) for tests.

Usage::

    node = start_storage_node(zookeeper, tmp_path, num_partitions=4)   # cluster + node + assign all
    try:
        asyncio.run(...)  # StorageClient("127.0.0.1", node.port, client_ssl(), node.key, node.num_partitions)
        node.kill(); node.restart()
    finally:
        node.close()

Every wait is bounded; a node that dies while starting raises with its log.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from testkit import free_tcp_port
from zygote import ForkedProcess, launch_forked_node, run_forked

from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import INDEX_ENTRY, INDEX_ENTRY_SIZE_BYTES, RECORD_HEADER_SIZE_BYTES
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import issue_store_sessions

T = TypeVar("T")

HOST = "127.0.0.1"
DEFAULT_NUM_PARTITIONS = 4
NODE_READY_TIMEOUT_S = 60.0
NODE_EXIT_TIMEOUT_S = 30.0
READY_POLL_INTERVAL_S = 0.1
PROBE_TIMEOUT_MS = 2_000
CLI_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0
ZK_SESSION_TIMEOUT_MS = 10_000


def minimal_storage_keys(directory: Path) -> dict[str, Any]:
    """The fewest keys a storage configuration parses with (for the configuration's own tests)."""
    return {
        "storage.port": 1,
        "storage.admin.port": 2,
        "storage.directory": str(directory),
        "zookeeper.connectString": "127.0.0.1:1",
        "zookeeper.sessionTimeout": 10_000,
        "cluster.root": "/c",
    }


def client_ssl() -> ssl.SSLContext:
    """The insecure client context (no trust store), as the original's tools by default."""
    return client_context(TlsConfig())


# waltz_cli.main has no __main__ guard; this is what the `waltz` script runs.
_WALTZ_MAIN = "from waltz_cli.main import main; main()"


def waltz_command(*args: str) -> list[str]:
    return [sys.executable, "-c", _WALTZ_MAIN, *args]


def run_waltz(*args: str, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a `waltz` command to completion (bounded) in a process of its own, capturing its output."""
    return run_forked(waltz_command(*args), args, timeout_s=timeout_s)


# Tests talk to nodes with session ids of their own, up to this one; a node accepts only ids
# that ZooKeeper has issued, so the test cluster issues it as a server would.
ISSUED_SESSION_ID = 1_000


def create_test_cluster(
    zookeeper: str, num_partitions: int = DEFAULT_NUM_PARTITIONS, root: str | None = None
) -> tuple[str, uuid.UUID]:
    """A new cluster in ZooKeeper: (cluster root, key)."""
    root = root or f"/test-{uuid.uuid4().hex[:16]}/cluster"
    with connect(ZooKeeperSettings(zookeeper, root)) as client:
        params = create_cluster(client, root, "test-cluster", num_partitions)
        issue_store_sessions(client, root, num_partitions, ISSUED_SESSION_ID)
    return root, params.key


def make_records(
    first_transaction_id: int, count: int, partition_id: int = 0, size_bytes: int = 32
) -> list[Record]:
    """Consecutive records with recognizable data and a correct data checksum."""
    import zlib

    from waltz_engine.common.crc import to_signed32

    records = []
    for txid in range(first_transaction_id, first_transaction_id + count):
        data = (f"txn-{txid}-".encode() * (size_bytes // 8 + 1))[:size_bytes]
        req_id = ReqId(1, 1, partition_id, txid + 1)
        records.append(Record(txid, req_id, txid % 7, data, to_signed32(zlib.crc32(data))))
    return records


def directory_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` by relative path (to prove nothing changed)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


class StorageNodeProcess:
    """One storage node process (what `waltz storage start` runs) on its own directory and free ports."""

    def __init__(
        self,
        zookeeper: str,
        cluster_root: str,
        key: uuid.UUID,
        num_partitions: int,
        work_dir: Path,
        *,
        jetty: bool = True,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.zookeeper = zookeeper
        self.cluster_root = cluster_root
        self.key = key
        self.num_partitions = num_partitions
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.directory = self.work_dir / "data"
        self.config_path = self.work_dir / "storage.yml"
        self.log_path = self.work_dir / "storage.log"
        self.host = HOST
        self.port = free_tcp_port()
        self.admin_port = free_tcp_port()
        self.jetty_port: int | None = free_tcp_port() if jetty else None
        config: dict[str, Any] = {
            "storage.host": HOST,
            "storage.port": self.port,
            "storage.admin.port": self.admin_port,
            "storage.directory": str(self.directory),
            "zookeeper.connectString": zookeeper,
            "zookeeper.sessionTimeout": ZK_SESSION_TIMEOUT_MS,
            "cluster.root": cluster_root,
        }
        if self.jetty_port is not None:
            config["storage.jetty.port"] = self.jetty_port
        config.update(extra_config or {})
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.process: ForkedProcess | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, wait: bool = True) -> StorageNodeProcess:
        assert self.process is None or self.process.poll() is not None, "node already running"
        # What `waltz storage start` runs, forked from a warm parent: the command line's and the
        # engine's imports cost ~0.5 s of CPU a start, and the suite starts nodes hundreds of
        # times; the command itself is tested in tests/storage_node.
        self.process = launch_forked_node(
            "waltz_engine.storage", ["--config", str(self.config_path)], self.work_dir, self.log_path
        )
        if wait:
            self.wait_ready()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        """Until the admin port completes an OPEN; raises if the node exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"storage node exited with {self.process.returncode}:\n{self.log_text()}")
            try:
                self.run(self._probe())
                return
            except (StorageRpcError, ConnectionClosedError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"storage node not ready within {timeout_s} s:\n{self.log_text()}")
            time.sleep(READY_POLL_INTERVAL_S)

    async def _probe(self) -> None:
        admin = self.admin_client()
        await admin.open(PROBE_TIMEOUT_MS)
        await admin.close()

    def wait_exit(self, timeout_s: float = NODE_EXIT_TIMEOUT_S) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap."""
        if self.running:
            os.kill(self.pid, signal.SIGKILL)
            self.wait_exit()

    def terminate(self, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (or ``sig``) and wait for a clean exit; returns the exit code."""
        assert self.process is not None
        if self.running:
            os.kill(self.pid, sig)
        return self.wait_exit()

    def restart(self, wait: bool = True) -> StorageNodeProcess:
        if self.running:
            self.terminate()
        return self.start(wait)

    def close(self) -> None:
        """Stop the node however it is (for finally blocks)."""
        if self.running:
            try:
                self.terminate()
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> StorageNodeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- clients ---------------------------------------------------------------------------

    @staticmethod
    def run(coro: Awaitable[T]) -> T:
        async def go() -> T:
            return await coro

        return asyncio.run(go())

    def admin_client(self) -> StorageAdminClient:
        return StorageAdminClient(self.host, self.admin_port, client_ssl(), self.key, self.num_partitions)

    def data_client(self, *, used_by_offline_recovery: bool = False) -> StorageClient:
        return StorageClient(
            self.host,
            self.port,
            client_ssl(),
            self.key,
            self.num_partitions,
            used_by_offline_recovery=used_by_offline_recovery,
        )

    async def with_admin(self, action: Callable[[StorageAdminClient], Awaitable[T]]) -> T:
        admin = self.admin_client()
        await admin.open()
        try:
            return await action(admin)
        finally:
            await admin.close()

    def assign(self, partition_ids: Sequence[int] | None = None, assigned: bool = True) -> None:
        """ASSIGN (or unassign) partitions over the admin port; all partitions by default."""
        ids = list(range(self.num_partitions)) if partition_ids is None else list(partition_ids)
        self.run(self.with_admin(lambda a: a.set_partition_assignment(ids, assigned, False)))


def start_storage_node(
    zookeeper: str,
    work_dir: Path,
    num_partitions: int = DEFAULT_NUM_PARTITIONS,
    *,
    assign: Sequence[int] | None = None,
    jetty: bool = True,
    extra_config: dict[str, Any] | None = None,
) -> StorageNodeProcess:
    """Create a cluster, start a node on it, wait until ready, assign ``assign`` (default: all)."""
    root, key = create_test_cluster(zookeeper, num_partitions)
    node = StorageNodeProcess(
        zookeeper, root, key, num_partitions, work_dir, jetty=jetty, extra_config=extra_config
    )
    node.start()
    try:
        node.assign(assign)
    except BaseException:
        node.close()
        raise
    return node


def flip_data_bits(partition_dir: Path, txids: Iterable[int], first: int = 0) -> None:
    """Flip one bit in the data of each record of ``txids`` (all in the segment beginning at
    ``first``, by default the first segment)."""
    seg = partition_dir / f"{first:019d}.seg"
    assert seg.exists() and (first or sorted(partition_dir.glob("*.seg"))[0] == seg), seg
    index = seg.with_suffix(".idx").read_bytes()
    fd = os.open(seg, os.O_RDWR)
    try:
        for txid in txids:
            at_entry = HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (txid - first)
            (offset,) = INDEX_ENTRY.unpack_from(index, at_entry)
            at = offset + RECORD_HEADER_SIZE_BYTES + 5
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x04]), at)
        os.fsync(fd)
    finally:
        os.close(fd)


def node_health(port: int) -> tuple[int, dict[str, Any]]:
    """A node's ``/health``: the status code and the JSON body (also for 500)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=HTTP_TIMEOUT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
