"""ACLs on TLS identities on real processes (issue 34): one `dev up --mtls` cluster for the file,
with the authorizer on and three identities: two services (svc-a, svc-b) and the operator
(`client.yml`, its ZooKeeper identity a writer of our own znodes).

svc-a owns partitions 0-1 and svc-b 2-3 (granted by the operator through `waltz acl grant`);
each appends to and reads its own and is refused the other's with AuthorizationError; neither
moves partitions nor writes on a storage node's admin port, the operator does; a revoked grant
ends an open feed within 5 s; without a ZooKeeper write identity a service changes neither
retention nor ACLs; the audit logs hold the refusals and /metrics counts them without names.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_support.app import MockCallbacks, MockContext
from kazoo.security import Permissions
from testkit import unique_cluster_root
from typer.testing import CliRunner
from zygote import launch_forked_node

from waltz_cli.main import app
from waltz_engine.client import AuthorizationError, WaltzClient, WaltzClientConfig
from waltz_engine.common.config import Config
from waltz_engine.common.crc import crc32
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.channel import connect as open_framed
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.wire.client_messages import (
    CLIENT_CODECS,
    PARTITION_STATE_NOT_READY,
    AppendRequest,
    HighWaterMarkRequest,
    MountRequest,
    MountResponse,
)
from waltz_engine.wire.hello import CLIENT_HELLO_TEXT
from waltz_engine.zk.connection import connect

SVC_A, SVC_B = "svc-a", "svc-b"
PRINCIPAL_A, PRINCIPAL_B = "CN=svc-a,O=waltz-dev", "CN=svc-b,O=waltz-dev"
OWN = {SVC_A: (0, 1), SVC_B: (2, 3)}
PRINCIPALS = {SVC_A: PRINCIPAL_A, SVC_B: PRINCIPAL_B}
REVOCATION_BOUND_S = 5.0
TEST_BOUND_S = 60.0
UP_TIMEOUT_MS = 120_000
JAVA_LIKE_CLIENT_ID = 999_999  # no registered client has it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("acl-cluster"),
        2,
        1,
        4,
        zookeeper=zookeeper,
        cluster_root=unique_cluster_root(),
        settings={"authorizer.enabled": True},
        launcher=launch_forked_node,
        mtls=True,
        identities=[SVC_A, SVC_B],
    )
    try:
        local.up(UP_TIMEOUT_MS)
        for identity, (low, high) in OWN.items():
            granted = waltz(
                local, None, "acl", "grant", "--principal", PRINCIPALS[identity],
                "--operation", "append,read", "--partitions", f"{low}-{high}", "--json",
            )  # fmt: skip
            assert json.loads(granted)["added"] == 2
        yield local
    finally:
        local.down()


def config_path(cluster: LocalCluster, identity: str | None) -> Path:
    return cluster.client_config_path if identity is None else cluster.identity_config_path(identity)


def waltz(cluster: LocalCluster, identity: str | None, *args: str, code: int = 0) -> str:
    """`waltz ARGS -c <identity's client config>` in this process; its output (exit ``code``)."""
    result = CliRunner().invoke(app, [*args, "-c", str(config_path(cluster, identity))])
    assert result.exit_code == code, f"waltz {' '.join(args)} as {identity}: {result.output}"
    return result.output


def client_config(cluster: LocalCluster, identity: str | None, **overrides: Any) -> WaltzClientConfig:
    return WaltzClientConfig.from_config(Config.load(config_path(cluster, identity)), **overrides)


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test, TEST_BOUND_S))


def test_services_use_their_own_partitions_and_are_refused_the_others(cluster: LocalCluster) -> None:
    async def go() -> None:
        for identity, other in ((SVC_A, SVC_B), (SVC_B, SVC_A)):
            own, refused = OWN[identity][0], OWN[other][0]
            client = await WaltzClient.create(MockCallbacks(), client_config(cluster, identity))
            try:
                mine = MockContext(f"{identity}-own", partition=own)
                await client.submit(mine)
                assert await mine.result() is True
                assert await client.high_water_mark(own) >= 0
                theirs = MockContext(f"{identity}-theirs", partition=refused)
                with pytest.raises(AuthorizationError) as raised:
                    await client.submit(theirs)  # the mount is refused: nothing is sent
                error = raised.value
                assert (error.operation, error.partition_id, error.principal) == (
                    "read",
                    refused,
                    PRINCIPALS[identity],
                )
                with pytest.raises(AuthorizationError):
                    await client.high_water_mark(refused)
            finally:
                await client.close()

    run(go())
    rows = waltz(cluster, None, "tail", "-p", str(OWN[SVC_B][0]), "--no-follow", "--data")
    assert "svc-a-theirs" not in rows and "svc-b-own" in rows


def test_a_refused_append_is_certainly_not_committed_and_never_retried(cluster: LocalCluster) -> None:
    # svc-b may read partition 0 (so it mounts) but not append there.
    waltz(
        cluster, None, "acl", "grant", "--principal", PRINCIPAL_B, "--operation", "read", "--partitions", "0"
    )

    async def go() -> None:
        config = client_config(cluster, SVC_B, auto_mount=False)
        client = await WaltzClient.create(MockCallbacks(), config)
        try:
            await client.set_partitions([0])
            context = MockContext("svc-b-on-0", partition=0)
            await client.submit(context)
            with pytest.raises(AuthorizationError) as raised:
                await context.result()
            assert (raised.value.operation, raised.value.partition_id) == ("append", 0)
            assert context.exec_count == 1  # never retried
        finally:
            await client.close()

    try:
        run(go())
    finally:
        revoke = ("acl", "revoke", "--principal", PRINCIPAL_B, "--operation", "read", "--partitions", "0")
        assert json.loads(waltz(cluster, None, *revoke, "--json"))["removed"] == 1
    assert "svc-b-on-0" not in waltz(cluster, None, "tail", "-p", "0", "--no-follow", "--data")


def test_services_neither_move_partitions_nor_write_storage_admin_the_operator_does(
    cluster: LocalCluster,
) -> None:
    server = f"127.0.0.1:{cluster.servers[0].port}"
    storage = cluster.storages[0].connect_string
    move = ("server", "add-preferred-partition", "--server", server, "-p", "0")
    online = ("storage", "availability", "-s", storage, "-p", "0", "--online")
    # A read on the admin port, then the data port (admin: the servers' and recovery tools').
    max_txid = ("storage", "max-transaction-id", "-s", storage, "-p", "0")
    for identity in (SVC_A, SVC_B):
        assert "not authorized" in waltz(cluster, identity, *move, code=1)
        assert "not authorized" in waltz(cluster, identity, *online, code=1)
        assert "not authorized" in waltz(cluster, identity, *max_txid, code=1)
    waltz(cluster, None, *move)
    waltz(cluster, None, *online)
    waltz(cluster, None, *max_txid)


def test_a_revoked_grant_ends_an_open_feed_within_seconds(cluster: LocalCluster) -> None:
    waltz(
        cluster, None, "acl", "grant", "--principal", PRINCIPAL_B, "--operation", "read", "--partitions", "1"
    )

    class Callbacks(MockCallbacks):
        def __init__(self) -> None:
            super().__init__()
            self.refused: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        def uncaught_exception(
            self, partition_id: int, transaction_id: int, exception: BaseException
        ) -> None:
            if isinstance(exception, AuthorizationError) and not self.refused.done():
                self.refused.set_result(time.monotonic())

    async def go() -> None:
        callbacks = Callbacks()
        client = await WaltzClient.create(callbacks, client_config(cluster, SVC_B, auto_mount=False))
        try:
            await client.set_partitions([1])
            seen = len(callbacks.applied)
            await asyncio.to_thread(waltz, cluster, SVC_A, "append", "-p", "1", "fed-to-b")
            while len(callbacks.applied) == seen:  # the feed is open and delivering
                await asyncio.sleep(0.05)
            revoked_at = time.monotonic()
            await asyncio.to_thread(
                waltz, cluster, None, "acl", "revoke", "--principal", PRINCIPAL_B,
                "--operation", "read", "--partitions", "1",
            )  # fmt: skip
            ended_at = await asyncio.wait_for(callbacks.refused, REVOCATION_BOUND_S)
            assert ended_at - revoked_at < REVOCATION_BOUND_S
            applied = len(callbacks.applied)
            await asyncio.to_thread(waltz, cluster, SVC_A, "append", "-p", "1", "after-revoke")
            await asyncio.sleep(0.5)
            assert len(callbacks.applied) == applied  # nothing more is delivered
        finally:
            await client.close()

    run(go())


def test_without_a_zookeeper_write_identity_a_service_changes_neither_retention_nor_acls(
    cluster: LocalCluster,
) -> None:
    before = waltz(cluster, None, "acl", "list", "--json")
    mine = json.loads(waltz(cluster, SVC_A, "acl", "list", "--principal", PRINCIPAL_A, "--json"))["entries"]
    assert {(e["principal"], e["operation"], e["partitions"]) for e in mine} == {
        (PRINCIPAL_A, "append", "0-1"),
        (PRINCIPAL_A, "read", "0-1"),
    }  # anyone may read the ACLs
    retention = waltz(cluster, SVC_A, "retention", "set", "-p", "0", "--before", "0", "--force", code=1)
    assert "NoAuthError" in retention
    grant = waltz(cluster, SVC_A, "acl", "grant", "--principal", PRINCIPAL_A, "--operation", "admin", code=1)
    assert "NoAuthError" in grant
    # Nor force a partition onto a server (a move through ZooKeeper, <root>/forcedAssignments).
    assert "NoAuthError" in waltz(cluster, SVC_A, "server", "assign", "-p", "0", "--server", "1", code=1)
    assert waltz(cluster, None, "acl", "list", "--json") == before
    # Our own znodes: read for everyone, all for the writers; the original's stay open.
    with connect(cluster.zookeeper_settings()) as zk:
        own = zk.get_acls(f"{cluster.cluster_root}/acl")[0]
        assert [(a.id.scheme, a.perms) for a in own] == [("world", Permissions.READ)] + [
            ("digest", Permissions.ALL)
        ] * 2
        original = zk.get_acls(f"{cluster.cluster_root}/store/assignment")[0]
        assert [(a.id.scheme, a.id.id, a.perms) for a in original] == [("world", "anyone", Permissions.ALL)]
    waltz(cluster, None, "retention", "set", "-p", "0", "--before", "0", "--force")  # the operator may
    with connect(cluster.zookeeper_settings()) as zk:  # and what it creates there is secured too
        bound = zk.get_acls(f"{cluster.cluster_root}/retention/partition/0")[0]
        assert [a.id.scheme for a in bound] == ["world", "digest", "digest"]
    waltz(cluster, None, "retention", "clear", "-p", "0")


def test_the_audit_logs_hold_the_refusals_and_metrics_count_them(cluster: LocalCluster) -> None:
    # Refusals of its own (the file's tests may run in any order, or alone).
    storage = cluster.storages[0].connect_string
    waltz(cluster, SVC_A, "tail", "-p", "2", "--no-follow", code=1)
    waltz(
        cluster,
        SVC_A,
        "server",
        "add-preferred-partition",
        "--server",
        f"127.0.0.1:{cluster.servers[0].port}",
        "-p",
        "2",
        code=1,
    )
    waltz(cluster, SVC_A, "storage", "availability", "-s", storage, "-p", "2", "--online", code=1)
    server_lines = [
        json.loads(line) for line in (cluster.servers[0].directory / "audit.log").read_text().splitlines()
    ]
    refused = {
        (r["principal"], r["operation"], r["resource"]) for r in server_lines if r["event"] == "refused"
    }
    assert {(PRINCIPAL_A, "read", "partition 2"), (PRINCIPAL_A, "admin", "partition 2")} <= refused
    assert any(r["event"] == "acl-change" for r in server_lines)
    storage_lines = [
        json.loads(line) for line in (cluster.storages[0].directory / "audit.log").read_text().splitlines()
    ]
    assert any(
        r["event"] == "refused"
        and r["principal"] == PRINCIPAL_A
        and r["request"] == "AdminPartitionAvailableRequest"
        for r in storage_lines
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.servers[0].jetty_port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    gauges = json.loads(metrics)["gauges"]
    assert gauges["waltz-authorizer.refused-read"]["value"] > 0
    assert gauges["waltz-authorizer.refused-admin"]["value"] > 0
    assert "svc-a" not in metrics and "svc-b" not in metrics


def test_a_client_of_the_original_versions_is_refused_as_the_original_would_answer(
    cluster: LocalCluster,
) -> None:
    """What a Java 0.13.2 client meets (it speaks versions 0-4): a refused MOUNT is NOT_READY (it
    retries), a refused APPEND is dropped (nothing written), and the server logs the refusal."""
    files = cluster.identity_files
    assert files is not None
    tls = TlsConfig(str(files.key_store(SVC_A)), None, "PEM", str(files.ca), None, "PEM")
    req_id = ReqId(JAVA_LIKE_CLIENT_ID, 0, 3, 1)
    data = b"java-like"

    async def go() -> None:
        conn = await open_framed(
            "127.0.0.1",
            cluster.servers[0].port,
            client_context(tls),
            {4: CLIENT_CODECS[4]},
            CLIENT_HELLO_TEXT,
        )
        try:
            assert conn.version == 4
            await conn.send(MountRequest(req_id, -1, 0))
            answer = await asyncio.wait_for(conn.receive(), TEST_BOUND_S)
            assert answer == MountResponse(req_id, PARTITION_STATE_NOT_READY)
            await conn.send(AppendRequest(req_id._replace(seq_num=2), -1, (), (), (), 0, data, crc32(data)))
            await conn.send(HighWaterMarkRequest(req_id._replace(seq_num=3)))  # dropped too
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(conn.receive(), 1.0)
        finally:
            await conn.close()

    run(go())
    assert "java-like" not in waltz(cluster, None, "tail", "-p", "3", "--no-follow", "--data")
    lines = [
        json.loads(line) for line in (cluster.servers[0].directory / "audit.log").read_text().splitlines()
    ]
    requests = {r["request"] for r in lines if r["event"] == "refused" and r["resource"] == "partition 3"}
    assert {"MountRequest", "AppendRequest"} <= requests
