"""Shared by the operator-command tests: a CLI app with the commands, and a 3-storage cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from storage_node_support import StorageNodeProcess, create_test_cluster, make_records
from typer.testing import CliRunner, Result

from waltz_cli import options
from waltz_cli.commands import cluster, recovery, server_admin
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import add_storage_node, assign_partitions

NUM_PARTITIONS = 2
NUM_STORAGES = 3
SESSION_ID = 7


def build_app() -> typer.Typer:
    """The commands as the lead registers them (independent of waltz_cli.main)."""
    app = options.group(help="waltz")
    server = options.group(help="waltz server")
    server_admin.register(server)
    app.add_typer(server, name="server")
    app.add_typer(cluster.app, name="cluster")
    app.command("recover")(recovery.recover)
    app.command("truncate")(recovery.truncate)
    return app


APP = build_app()
runner = CliRunner()


def invoke(*args: str) -> Result:
    return runner.invoke(APP, list(args))


def ok_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def one_line_error(result: Result, *fragments: str, exit_code: int = 1) -> str:
    """A failure (exit 1), or with ``exit_code=2`` a usage error, as one line holding ``fragments``."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


class StorageCluster:
    def __init__(self, zookeeper: str, root: str, nodes: list[StorageNodeProcess]) -> None:
        self.zookeeper = zookeeper
        self.root = root
        self.nodes = nodes

    @property
    def where(self) -> tuple[str, ...]:
        return ("-z", self.zookeeper, "-r", self.root)

    def settings(self) -> ZooKeeperSettings:
        return ZooKeeperSettings(self.zookeeper, self.root)

    @staticmethod
    def storage(node: StorageNodeProcess) -> str:
        return f"{node.host}:{node.port}"

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@contextmanager
def storage_cluster(zookeeper: str, work: Path) -> Iterator[StorageCluster]:
    """Three nodes, each holding every partition, registered and assigned in ZooKeeper."""
    root, key = create_test_cluster(zookeeper, NUM_PARTITIONS)
    nodes = [
        StorageNodeProcess(zookeeper, root, key, NUM_PARTITIONS, work / f"s{i}", jetty=False)
        for i in range(NUM_STORAGES)
    ]
    cluster_ = StorageCluster(zookeeper, root, nodes)
    try:
        with connect(cluster_.settings()) as zk:
            for group, node in enumerate(nodes):
                node.start()
                node.assign()
                add_storage_node(zk, root, cluster_.storage(node), group, node.admin_port)
                assign_partitions(zk, root, cluster_.storage(node), list(range(NUM_PARTITIONS)))
        yield cluster_
    finally:
        cluster_.close()


async def write_records(
    node: StorageNodeProcess, partition_id: int, first: int, count: int, lwm: int
) -> None:
    """Append records with SESSION_ID: up to ``lwm``, which becomes the low-water mark, then the rest
    (a node refuses a low-water mark below its max transaction id)."""
    assert first <= lwm < first + count
    records = make_records(first, count, partition_id)
    split = lwm - first + 1
    client = node.data_client()
    await client.open()
    try:
        await client.append(SESSION_ID, partition_id, records[:split])
        await client.set_low_water_mark(SESSION_ID, partition_id, lwm)
        await client.append(SESSION_ID, partition_id, records[split:])
    finally:
        await client.close()
