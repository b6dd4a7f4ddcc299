"""A running local Waltz cluster (real ZooKeeper, storage and server processes) for any test.

Usage, module-scoped (one cluster for the whole test module)::

    from cluster_support import local_cluster

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory):
        with local_cluster(tmp_path_factory, storages=3, servers=1, partitions=4) as c:
            yield c

    def test_x(cluster):
        cluster.client_config_path   # client YAML (zookeeper.connectString, cluster.root)
        cluster.zookeeper            # ZooKeeper connect string
        cluster.cluster_root
        cluster.storages[0].kill(); cluster.storages[0].restart()   # also pause()/resume()/stop()
        cluster.servers[0].port; cluster.storages[0].admin_port; node.log_text()
        cluster.wait_verified()      # until `cluster verify` passes again (bounded)
        waltz_client_config(cluster) # a WaltzClientConfig for this cluster

Pass ``zookeeper=<the session fixture's connect string>`` to share the session's ZooKeeper
(saves a JVM); the cluster then gets a unique root. The cluster is always stopped on exit; if
it fails to come up, the error carries the failing node's log tail.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from testkit import unique_cluster_root
from zygote import launch_forked_node, run_forked

from waltz_engine.client import WaltzClientConfig
from waltz_engine.common.config import Config
from waltz_engine.ops.devcluster import DEFAULT_CLUSTER_ROOT, LocalCluster

CLUSTER_UP_TIMEOUT_MS = 120_000
CLI_TIMEOUT_S = 120.0


def waltz_cli_command(*args: str) -> list[str]:
    """``waltz ARGS...`` as a new process: the real command line, hidden aliases and all."""
    return [sys.executable, "-m", "waltz_cli", *args]


def run_waltz_cli(
    *args: str,
    cwd: Path | None = None,
    stdin: str | None = None,
    timeout_s: float = CLI_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    stall_s: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `waltz ARGS...` to completion (bounded) in a process of its own, capturing its output;
    ``env`` is added to this process's environment. ``stall_s``: a wait on progress (``timeout_s``
    then bounds a command that keeps running; see :func:`zygote.wait_while_working`)."""
    return run_forked(
        waltz_cli_command(*args),
        args,
        cwd=cwd,
        stdin=stdin,
        env={**os.environ, **env} if env is not None else None,
        timeout_s=timeout_s,
        stall_s=stall_s,
    )


@contextmanager
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    storages: int = 3,
    servers: int = 1,
    partitions: int = 4,
    *,
    zookeeper: str | None = None,
    wait_timeout_ms: int = CLUSTER_UP_TIMEOUT_MS,
    storage_config: dict[str, Any] | None = None,
    replicas: int | None = None,
    settings: Mapping[str, Any] | None = None,
    server_config: dict[str, Any] | None = None,
) -> Iterator[LocalCluster]:
    """A healthy cluster (``cluster verify`` passed) in a fresh directory; stopped on exit.
    ``settings`` are `dev up --set` keys (every node's YAML)."""
    cluster = LocalCluster(
        tmp_path_factory.mktemp("waltz-cluster"),
        storages,
        servers,
        partitions,
        zookeeper=zookeeper,
        cluster_root=unique_cluster_root() if zookeeper is not None else DEFAULT_CLUSTER_ROOT,
        storage_config=storage_config,
        replicas=replicas,
        settings=settings,
        server_config=server_config,
        launcher=launch_forked_node,
    )
    try:
        cluster.up(wait_timeout_ms)
        yield cluster
    finally:
        cluster.down()


def module_cluster(*, storages: int, partitions: int) -> Any:
    """A module's ``cluster`` fixture (``cluster = module_cluster(...)``): one healthy cluster on
    the session's ZooKeeper, one server, shared by every test of the module."""

    @pytest.fixture(scope="module", name="cluster")
    def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
        with local_cluster(
            tmp_path_factory, storages=storages, servers=1, partitions=partitions, zookeeper=zookeeper
        ) as c:
            yield c

    return cluster


def waltz_client_config(cluster: LocalCluster, **overrides: Any) -> WaltzClientConfig:
    """The client config of ``cluster`` (its client.yml); ``overrides`` as WaltzClientConfig fields."""
    return WaltzClientConfig.from_config(Config.load(cluster.client_config_path), **overrides)


# (partition, txid, client id, generation, seq num, header, data as hex): a row of `waltz tail`.
TailRow = tuple[int, int, int, int, int, int, str]


def run_cli_each(runs: list[tuple[list[str], str]]) -> list[str]:
    """Run ``waltz`` commands (arguments, stdin) one after the other, each to exit 0; their
    outputs, in order."""
    outputs = []
    for arguments, stdin in runs:
        result = run_waltz_cli(*arguments, stdin=stdin)
        assert result.returncode == 0, f"waltz {' '.join(arguments)}: {result.stderr}"
        outputs.append(result.stdout)
    return outputs


def append_lines(cluster: LocalCluster, lines_by_partition: Mapping[int, list[str]]) -> None:
    """`waltz append`: one transaction per line, a partition at a time."""
    config = str(cluster.client_config_path)
    run_cli_each(
        [
            (["append", "--partition", str(p), "--config", config], "\n".join(lines) + "\n")
            for p, lines in lines_by_partition.items()
        ]
    )


def tailed(cluster: LocalCluster, partitions: Iterable[int]) -> list[TailRow]:
    """Every committed transaction of ``partitions`` as `waltz tail --data --json` prints it."""
    config = str(cluster.client_config_path)
    wanted = list(partitions)
    outputs = run_cli_each(
        [
            (["tail", "--partition", str(p), "--no-follow", "--data", "--json", "--config", config], "")
            for p in wanted
        ]
    )
    rows = []
    for partition, output in zip(wanted, outputs, strict=True):
        for line in output.splitlines():
            t = json.loads(line)
            rows.append(
                (
                    partition,
                    t["transaction_id"],
                    t["client_id"],
                    t["generation"],
                    t["seq_num"],
                    t["header"],
                    t["data_hex"],
                )
            )
    return rows


# A restarted or rebuilt cluster's server serves its port before it is assigned its partitions and
# has recovered them; under a loaded CI that took longer than one RPC's timeout (a `waltz append`'s
# or `waltz tail`'s 10 s, once each in clean-clone runs), so tests wait for it first (bounded).
SERVING_WAIT_S = 120


def wait_serving(cluster: LocalCluster, partitions: Iterable[int] = (0,)) -> None:
    """Until a server answers each of ``partitions``' high-water marks (bounded)."""
    from client_support.app import MockCallbacks

    from waltz_engine.client import WaltzClient
    from waltz_engine.common.errors import WaltzError

    async def wait() -> None:
        deadline = time.monotonic() + SERVING_WAIT_S
        async with WaltzClient(MockCallbacks(), waltz_client_config(cluster)) as client:
            for partition in partitions:
                while True:
                    try:
                        await client.high_water_mark(partition)
                        break
                    except WaltzError:
                        if time.monotonic() > deadline:
                            raise

    asyncio.run(wait())


# Waits for the coordinator's assignment: every POLL_S, ASSIGNMENT_POLLS times at most (60 s).
ASSIGNMENT_POLL_S = 0.05
ASSIGNMENT_POLLS = 1200


def wait_assigned(settings: Any, server_id: int, partition_id: int | None = None) -> int:
    """Waits (bounded) until the assignment gives ``server_id`` ``partition_id`` (or any partition);
    that partition's generation."""
    import time

    from waltz_engine.zk.cluster import read_partition_assignment
    from waltz_engine.zk.connection import connect

    with connect(settings) as zk:
        for _ in range(ASSIGNMENT_POLLS):
            for server in read_partition_assignment(zk, settings.cluster_root).servers:
                for info in server.partitions if server.server_id == server_id else ():
                    if partition_id is None or info.partition_id == partition_id:
                        return int(info.generation)
            time.sleep(ASSIGNMENT_POLL_S)
    raise AssertionError(f"server {server_id} was not assigned partition {partition_id} (or any)")
