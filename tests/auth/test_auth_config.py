"""The authorizer's configuration, the wire it adds (our client codec v5 only, the original's
versions untouched), and `dev up`'s refusals of options that cannot work (issue 34)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.auth.zk_acls import digest_writer, is_own_znode, read_zookeeper_auth
from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.reqid import ReqId
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.devcluster.nodes import DevClusterError
from waltz_engine.server.config import ServerConfig
from waltz_engine.wire.client_messages import (
    AUTHORIZATION_VERSION,
    CLIENT_CODECS,
    EXTENDED_CLIENT_CODECS,
    AppendRequest,
    AuthorizationFailure,
    MountRequest,
)
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES, Frame

SERVER_KEYS = {
    "zookeeper.connectString": "127.0.0.1:2181",
    "zookeeper.sessionTimeout": 30000,
    "cluster.root": "/waltz",
    "server.port": 6000,
}
REQ = ReqId(7, 1, 3, 9)


def test_the_original_versions_are_untouched_and_v5_adds_one_message() -> None:
    assert sorted(CLIENT_CODECS) == [0, 1, 2, 3, 4]
    assert sorted(EXTENDED_CLIENT_CODECS) == [*range(AUTHORIZATION_VERSION + 1)]
    v4, v5 = CLIENT_CODECS[4], EXTENDED_CLIENT_CODECS[AUTHORIZATION_VERSION]
    assert {s.type_code for s in v5.specs} - {s.type_code for s in v4.specs} == {23}
    for message in (MountRequest(REQ, 5, 1), AppendRequest(REQ, 5, (1,), (), (), 0, b"x", 0)):
        # The same payload; only the frame header's version differs.
        assert (
            v5.encode_frame(message)[FRAME_HEADER_SIZE_BYTES:]
            == v4.encode_frame(message)[FRAME_HEADER_SIZE_BYTES:]
        )
    refusal = AuthorizationFailure(REQ, 2, "append", 3, "CN=svc-a,O=payments")
    frame = v5.encode_frame(refusal)
    assert (
        v5.decode_frame(Frame(v5.magic, v5.version, memoryview(frame)[FRAME_HEADER_SIZE_BYTES:])) == refusal
    )


def test_the_authorizer_is_off_by_default_and_needs_a_trust_store() -> None:
    assert not ServerConfig.from_config(Config(SERVER_KEYS)).authorizer.enabled
    with pytest.raises(ConfigError, match="trustStore"):
        ServerConfig.from_config(Config({**SERVER_KEYS, "authorizer.enabled": True}))
    enabled = ServerConfig.from_config(
        Config(
            {
                **SERVER_KEYS,
                "authorizer.enabled": True,
                "server.ssl.trustStore.location": "/ca.pem",
                "authorizer.nodePrincipals": "CN=node-1, O=ops;CN=node-2,O=ops",
                "authorizer.principal.mapping.rules": "RULE:^CN=(.*?),.*$/$1/, DEFAULT",
            }
        )
    ).authorizer
    assert enabled.node_principals == ("CN=node-1,O=ops", "CN=node-2,O=ops")
    assert [rule.text for rule in enabled.rules] == ["RULE:^CN=(.*?),.*$/$1/", "DEFAULT"]
    with pytest.raises(ConfigError, match="nodePrincipals"):
        ServerConfig.from_config(
            Config(
                {
                    **SERVER_KEYS,
                    "authorizer.enabled": True,
                    "server.ssl.trustStore.location": "/ca.pem",
                    "authorizer.nodePrincipals": "node-1",
                }
            )
        )


def test_zookeeper_identities_and_our_own_znodes() -> None:
    # ZooKeeper's form: the user, then base64 of SHA-1("user:password") (a real ZooKeeper takes
    # it: tests/auth/test_auth_cluster.py).
    scheme, user, hashed = digest_writer("op:pw").split(":")
    assert (scheme, user, len(base64.b64decode(hashed))) == ("digest", "op", 20)
    assert read_zookeeper_auth(Config({})) is None
    auth = read_zookeeper_auth(
        Config(
            {
                "zookeeper.auth.scheme": "digest",
                "zookeeper.auth.digest": "op:pw",
                "zookeeper.acl.writers": ["digest:op:x"],
            }
        )
    )
    assert auth is not None and auth.kazoo_options() == {"auth_data": [("digest", "op:pw")]}
    assert [(a.perms, a.id.scheme) for a in auth.own_acl()] == [(1, "world"), (31, "digest")]
    for bad in (
        {"zookeeper.auth.scheme": "sasl"},
        {"zookeeper.auth.scheme": "digest"},
        {"zookeeper.acl.writers": "ip:1"},
    ):
        with pytest.raises(ConfigError):
            read_zookeeper_auth(Config(bad))
    assert is_own_znode("/waltz", "/waltz/acl") and is_own_znode("/waltz", "/waltz/retention/partition/3")
    assert not is_own_znode("/waltz", "/waltz/store/assignment") and not is_own_znode("/waltz", "/waltzacl")


def test_dev_up_refuses_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(DevClusterError, match="needs --mtls"):
        LocalCluster(tmp_path / "a", 1, 1, 1, identities=["svc-a"])
    with pytest.raises(DevClusterError, match="--identity"):
        LocalCluster(tmp_path / "b", 1, 1, 1, mtls=True, identities=["../x"])
    cluster = LocalCluster(tmp_path / "c", 1, 1, 1, settings={"authorizer.enabled": True})
    with pytest.raises(DevClusterError, match="authorizer.enabled=true needs --mtls"):
        cluster.up(1_000)
    assert not cluster.is_running()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--principal", "svc-a", "--operation", "read"], "unknown principal form 'svc-a'"),
        (["--principal", "CN=svc-a", "--operation", "write"], "unknown operation 'write'"),
        (["--principal", "CN=svc-a", "--operation", "read", "--partitions", "3-1"], "goes backwards"),
    ],
)
def test_acl_commands_refuse_bad_entries_in_one_line_before_any_connection(
    args: list[str], says: str
) -> None:
    result = CliRunner().invoke(app, ["acl", "grant", *args, "-z", "127.0.0.1:1", "-r", "/nowhere"])
    assert result.exit_code == 1
    assert says in result.output and len(result.output.strip().splitlines()) == 1
