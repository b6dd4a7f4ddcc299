"""Operator commands against real `waltz server start` processes over three real storage nodes:
verify passing on a healthy cluster, check-connectivity, server list, preferred partitions and
forced assignment moving a partition between two servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import NUM_PARTITIONS, StorageCluster, invoke, ok_json, one_line_error, storage_cluster
from server_process_support import ServerProcess

from waltz_engine.common.address import HostPort
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.server.rpc_client import ServerRpcClient
from waltz_engine.zk.cluster import read_server_descriptors
from waltz_engine.zk.connection import connect

POLL_INTERVAL_S = 0.2
MAX_POLLS = 300  # bounded waits: at most a minute per condition


class Servers:
    def __init__(self, cluster: StorageCluster, a: ServerProcess, b: ServerProcess) -> None:
        self.cluster = cluster
        self.a = a
        self.b = b

    def server_id(self, server: ServerProcess) -> int:
        with connect(self.cluster.settings()) as zk:
            [found] = [d for d in read_server_descriptors(zk, self.cluster.root) if d.port == server.port]
        return found.server_id


def held(server: ServerProcess) -> list[int]:
    async def ask() -> list[int]:
        async with ServerRpcClient(HostPort("127.0.0.1", server.port), client_context(TlsConfig())) as rpc:
            return await rpc.server_partitions()

    return asyncio.run(ask())


def wait_until(condition: object, what: str) -> None:
    assert callable(condition)
    for _ in range(MAX_POLLS):
        if condition():
            return
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"not within {MAX_POLLS * POLL_INTERVAL_S} s: {what}")


def verify_passes(cluster: StorageCluster) -> bool:
    return invoke("cluster", "verify", *cluster.where, "--timeout-ms", "5000").exit_code == 0


@pytest.fixture(scope="module")
def servers(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    work: Path = tmp_path_factory.mktemp("operator-server")
    with storage_cluster(zookeeper, work) as cluster:
        a = ServerProcess(zookeeper, cluster.root, work / "server-a")
        b = ServerProcess(zookeeper, cluster.root, work / "server-b")
        try:
            a.start()
            yield Servers(cluster, a, b)
        finally:
            b.close()
            a.close()


def test_verify_connectivity_and_list_on_a_healthy_cluster(servers: Servers) -> None:
    cluster, a = servers.cluster, servers.a
    wait_until(lambda: held(a) == list(range(NUM_PARTITIONS)), "server A holds every partition")
    wait_until(lambda: verify_passes(cluster), "verify passes")
    report = ok_json("cluster", "verify", *cluster.where, "-p", "1")
    assert report["passed"] and [p["partition"] for p in report["partitions"]] == [1]
    assert len(report["partitions"][0]["validations"]) == 7
    text = invoke("cluster", "verify", *cluster.where)
    assert text.exit_code == 0 and text.stdout.strip().splitlines()[-1] == "Passed"

    storages = sorted(cluster.storage(n) for n in cluster.nodes)
    connectivity = invoke("cluster", "check-connectivity", *cluster.where)
    assert connectivity.exit_code == 0, connectivity.stderr
    expected = "{" + ", ".join(f"{s}=true" for s in storages) + "}"
    assert connectivity.stdout.strip() == f"Connectivity status of 127.0.0.1:{a.port} is: {expected}"

    listing = invoke("server", "list", "--http", f"127.0.0.1:{a.jetty_port}")
    assert listing.exit_code == 0, listing.stderr
    lines = listing.stdout.strip().splitlines()
    assert lines[0] == f"There are {NUM_PARTITIONS} partitions for current server"
    for p in range(NUM_PARTITIONS):
        [line] = [x for x in lines if x.startswith(f"Storage node for partition {p}: ")]
        assert sorted(line.split(": ", 1)[1].strip("[]").split(", ")) == storages
    not_http = f"127.0.0.1:{cluster.nodes[0].admin_port}"
    one_line_error(
        invoke("server", "list", "--http", not_http, "--timeout-ms", "2000"),
        "Cannot read metrics",
    )


def test_preferred_partitions_and_forced_assignment_move_partitions(servers: Servers) -> None:
    cluster, a, b = servers.cluster, servers.a, servers.b
    b.start()
    wait_until(lambda: len(held(a)) == 1 and len(held(b)) == 1, "the two servers share the partitions")
    target = held(a)[0]
    b_port = f"127.0.0.1:{b.port}"
    added = invoke("server", "add-preferred-partition", "--server", b_port, "-p", str(target))
    assert added.exit_code == 0, added.stderr
    wait_until(lambda: target in held(b), "B takes its preferred partition")
    one_line_error(
        invoke("server", "add-preferred-partition", "--server", b_port, "-p", "0,5"),
        f"Failed to add preferred partition(s) [0, 5] to server Endpoint {b_port}.",
    )
    removed = ok_json("server", "remove-preferred-partition", "--server", b_port, "-p", str(target))
    assert removed == {"server": b_port, "partitions": [target], "preferred": False}
    # --server also takes a live server's id, looked up in ZooKeeper (-z/-r).
    by_id = ("--server", str(servers.server_id(b)), *cluster.where, "-p", str(target))
    assert ok_json("server", "remove-preferred-partition", *by_id)["server"] == b_port

    assert target in held(b)  # un-preferring does not move it back: the force below must
    a_id = servers.server_id(a)
    forced = ok_json("server", "assign", *cluster.where, "--partition", str(target), "--server", str(a_id))
    assert forced["changed"] and forced["endpoint"] == f"127.0.0.1:{a.port}"
    wait_until(lambda: target in held(a) and target not in held(b), "the forced partition moves to A")
    assert ok_json("server", "unassign", *cluster.where, "-p", str(target))["changed"]
    wait_until(lambda: verify_passes(cluster), "verify passes with two servers")
