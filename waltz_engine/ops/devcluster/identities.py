"""`dev up --mtls`: a CA, the nodes' certificate, the operator's and each named identity's, and
the ZooKeeper digest identities of the operator and the servers (issue 34).

Everything lives in ``<dir>/tls/`` (PEM: a certificate with its private key in one file, the key
store form our nodes and tools read; ``ca.pem`` the trust store). The node principal, the
operator's and each identity's are ``CN=<name>,O=waltz-dev``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_engine.auth.zk_acls import DIGEST, ZooKeeperAuth, digest_writer
from waltz_engine.net.tls import TlsConfig
from waltz_engine.ops.devcluster.nodes import DevClusterError

TLS_DIR_NAME = "tls"
ORGANIZATION = "waltz-dev"
CA_NAME = "waltz-dev-ca"
NODE_NAME = "waltz-node"
OPERATOR_NAME = "operator"
SERVER_ZK_USER = "waltz-server"
CERT_VALIDITY_DAYS = 825
SECRETS_FILE_NAME = "zookeeper-secrets.json"


_IDENTITY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def checked_identities(identities: Sequence[str]) -> list[str]:
    """``--identity`` names, once each; a name that cannot be a file name part is refused."""
    for identity in identities:
        if not _IDENTITY_NAME.fullmatch(identity):
            raise DevClusterError(f"--identity {identity!r}: use letters, digits, '.', '_' and '-'")
    return list(dict.fromkeys(identities))


def saved_mtls(
    directory: Path, state: Mapping[str, Any] | None, mtls: bool, identities: list[str]
) -> tuple[bool, list[str]]:
    """--mtls and the identities of a new cluster (``state`` None) or of a saved one, where the
    identities named now are added to the saved ones (their certificates made on up)."""
    saved = mtls if state is None else bool(state.get("mtls", False))
    if mtls and not saved:
        raise DevClusterError(f"{directory} holds a cluster without --mtls: remove it (down --clean) first")
    if identities and not saved:
        raise DevClusterError("--identity needs --mtls: an identity is a client certificate")
    known = [] if state is None else list(state.get("identities", []))
    return saved, list(dict.fromkeys([*known, *identities]))


def authorizer_asked(settings: Mapping[str, Any]) -> bool:
    """Whether `--set authorizer.enabled=true` was given."""
    return str(settings.get("authorizer.enabled", "")).strip().lower() == "true"


def principal_of(name: str) -> str:
    return f"CN={name},O={ORGANIZATION}"


def client_config_name(identity: str) -> str:
    return f"client-{identity}.yml"


@dataclass(frozen=True)
class DevIdentities:
    """Where a dev cluster's TLS files are, and the ZooKeeper digests (made once, kept)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def key_store(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    @property
    def node(self) -> Path:
        return self.key_store(NODE_NAME)

    @property
    def operator(self) -> Path:
        return self.key_store(OPERATOR_NAME)

    def ensure(self, identities: list[str]) -> None:
        """The CA and every certificate that is not there yet (existing ones are kept)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.directory.mkdir(parents=True, exist_ok=True)
        ca_key_path = self.directory / "ca-key.pem"
        if not self.ca.exists() or not ca_key_path.exists():
            key, cert = _certificate(CA_NAME, None, None, ca=True)
            _write_private(ca_key_path, _key_pem(key))
            self.ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        for name in [NODE_NAME, OPERATOR_NAME, *identities]:
            path = self.key_store(name)
            if path.exists():
                continue
            key, cert = _certificate(name, ca_key, ca_cert.subject, ca=False)
            _write_private(path, cert.public_bytes(serialization.Encoding.PEM) + _key_pem(key))
        if not self._secrets_path.exists():
            _write_private(
                self._secrets_path,
                json.dumps(
                    {OPERATOR_NAME: secrets.token_hex(16), SERVER_ZK_USER: secrets.token_hex(16)}
                ).encode(),
            )

    @property
    def _secrets_path(self) -> Path:
        return self.directory / SECRETS_FILE_NAME

    def zookeeper_login(self, user: str) -> str:
        """``user:password`` of the operator's or the servers' ZooKeeper digest identity."""
        found: dict[str, str] = json.loads(self._secrets_path.read_text(encoding="utf-8"))
        return f"{user}:{found[user]}"

    def zookeeper_writers(self) -> list[str]:
        return [digest_writer(self.zookeeper_login(u)) for u in (OPERATOR_NAME, SERVER_ZK_USER)]

    def zookeeper_keys(self, user: str) -> dict[str, Any]:
        """The ZooKeeper keys of a process that logs in as ``user`` and may write our znodes."""
        return {
            "zookeeper.auth.scheme": DIGEST,
            "zookeeper.auth.digest": self.zookeeper_login(user),
            "zookeeper.acl.writers": self.zookeeper_writers(),
        }

    def tools_tls(self) -> TlsConfig:
        """The operator's certificate and the CA, for `dev up`'s own checks."""
        return TlsConfig(str(self.operator), None, "PEM", str(self.ca), None, "PEM")

    def operator_zookeeper_auth(self) -> ZooKeeperAuth | None:
        """The operator's ZooKeeper login (None before the files are made)."""
        if not self.directory.exists():
            return None
        return ZooKeeperAuth(
            DIGEST, self.zookeeper_login(OPERATOR_NAME), writers=tuple(self.zookeeper_writers())
        )

    def node_keys(self, kind: str, audit_log: Path, logs_in: bool) -> dict[str, Any]:
        """A node's keys: the nodes' certificate and the CA (``<kind>.ssl.*``), the node principal,
        its audit log; ``logs_in`` (servers): the ZooKeeper identity that writes our own znodes."""
        keys: dict[str, Any] = {
            **self.tls_keys(kind, NODE_NAME),
            "authorizer.nodePrincipals": [principal_of(NODE_NAME)],
            "authorizer.audit.log": str(audit_log),
        }
        if logs_in:
            keys.update(self.zookeeper_keys(SERVER_ZK_USER))
        return keys

    def client_configs(self, common: dict[str, Any], identities: list[str]) -> dict[str, dict[str, Any]]:
        """Client configs by file name: the operator's (``None`` key: the cluster's client.yml, with
        its ZooKeeper identity) and each identity's (``client-<name>.yml``)."""
        configs: dict[str, dict[str, Any]] = {
            "": {
                **common,
                **self.tls_keys("client", OPERATOR_NAME),
                **self.tls_keys("", OPERATOR_NAME),
                **self.zookeeper_keys(OPERATOR_NAME),
            }
        }
        for identity in identities:
            configs[client_config_name(identity)] = {
                **common,
                **self.tls_keys("client", identity),
                **self.tls_keys("", identity),
            }
        return configs

    def tls_keys(self, prefix: str, name: str) -> dict[str, str]:
        """``<prefix>.ssl.keyStore.location`` etc. for ``name``'s certificate (prefix "" for the
        tools' own ``ssl.*`` keys)."""
        dot = f"{prefix}." if prefix else ""
        return {
            f"{dot}ssl.keyStore.location": str(self.key_store(name)),
            f"{dot}ssl.keyStore.type": "PEM",
            f"{dot}ssl.trustStore.location": str(self.ca),
            f"{dot}ssl.trustStore.type": "PEM",
        }


def ensure_operator_grant(zk: Any, cluster_root: str, auth: ZooKeeperAuth | None, secure: bool) -> None:
    """``secure``: our own znodes given the writers' ACL first; then the operator allowed
    everything (the named identities get nothing until granted)."""
    from waltz_engine.auth.acl import ADMIN, ALL_PARTITIONS, APPEND, READ, change_acls, make_entries
    from waltz_engine.auth.zk_acls import secure_own_znodes
    from waltz_engine.zk.connection import ZooKeeperSettings

    if secure:
        secure_own_znodes(zk, cluster_root, ZooKeeperSettings("unused:1", cluster_root, auth=auth))
    operator = make_entries(principal_of(OPERATOR_NAME), [APPEND, READ, ADMIN], ALL_PARTITIONS, deny=False)
    change_acls(zk, cluster_root, operator)


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _certificate(name: str, issuer_key: Any, issuer: Any, ca: bool) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    # In the DER order C..CN, so that RFC 4514 (last first) writes CN=<name>,O=waltz-dev.
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(f"{name}.waltz.local")]), False
        )
    return key, builder.sign(issuer_key or key, hashes.SHA256())
