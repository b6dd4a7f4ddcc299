"""ZooKeeper, the other door: who may write our own znodes when the authorizer is on.

Every client reads ZooKeeper, and ``retention set``, forced assignments, export watermarks,
replica moves and the ACL znode itself are written there directly. So our own znodes (those
below, all our extension: Java 0.13.2 nodes never read them) get ZooKeeper ACLs: read for
everyone, everything for the identities ``zookeeper.acl.writers`` names (the operator's and the
servers'). The original's znodes keep the original's open ACLs, so Java nodes work unchanged:
the door that stays open (docs/operations.md).

A process logs in with ``zookeeper.auth.scheme``: ``digest`` (``zookeeper.auth.digest:
user:password``) or ``x509`` (ZooKeeper's TLS client port; ``zookeeper.auth.certFile``,
``keyFile``, ``caFile``: PEM files, the certificate's DN its identity). A writer is named as
ZooKeeper names it: ``digest:user:BASE64(SHA1(user:password))`` (:func:`digest_writer` makes
it) or ``x509:CN=...``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Id, Permissions

from waltz_engine.common.config import Config, ConfigError

if TYPE_CHECKING:
    from waltz_engine.zk.connection import ZooKeeperSettings

log = logging.getLogger(__name__)

KEY_AUTH_SCHEME = "zookeeper.auth.scheme"
KEY_AUTH_DIGEST = "zookeeper.auth.digest"
KEY_AUTH_CERT_FILE = "zookeeper.auth.certFile"
KEY_AUTH_KEY_FILE = "zookeeper.auth.keyFile"
KEY_AUTH_CA_FILE = "zookeeper.auth.caFile"
KEY_ACL_WRITERS = "zookeeper.acl.writers"
ZOOKEEPER_AUTH_KEYS = (
    KEY_AUTH_SCHEME,
    KEY_AUTH_DIGEST,
    KEY_AUTH_CERT_FILE,
    KEY_AUTH_KEY_FILE,
    KEY_AUTH_CA_FILE,
    KEY_ACL_WRITERS,
)
DIGEST, X509 = "digest", "x509"
SCHEMES = (DIGEST, X509)
# Our own znodes under the cluster root (every one our extension).
OWN_ZNODES = ("acl", "retention", "exports", "forcedAssignments", "replicaMoves")
_READ_FOR_EVERYONE = ACL(Permissions.READ, Id("world", "anyone"))


@dataclass(frozen=True)
class ZooKeeperAuth:
    scheme: str | None = None
    digest: str | None = None  # user:password
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    writers: tuple[str, ...] = ()

    def kazoo_options(self) -> dict[str, Any]:
        if self.scheme == DIGEST:
            assert self.digest is not None
            return {"auth_data": [(DIGEST, self.digest)]}
        if self.scheme == X509:
            return {"use_ssl": True, "certfile": self.cert_file, "keyfile": self.key_file, "ca": self.ca_file}
        return {}

    def own_acl(self) -> list[ACL]:
        acl = [_READ_FOR_EVERYONE]
        for writer in self.writers:
            scheme, _, ident = writer.partition(":")
            acl.append(ACL(Permissions.ALL, Id(scheme, ident)))
        return acl


def digest_writer(user_password: str) -> str:
    """ZooKeeper's digest id of ``user:password`` (DigestAuthenticationProvider.generateDigest)."""
    user, _, _ = user_password.partition(":")
    hashed = base64.b64encode(hashlib.sha1(user_password.encode()).digest()).decode()
    return f"{DIGEST}:{user}:{hashed}"


def _writers(config: Config) -> tuple[str, ...]:
    value = config.as_dict().get(KEY_ACL_WRITERS)
    if value is None:
        return ()
    texts: Sequence[Any] = value if isinstance(value, list) else str(value).split(";")
    writers = tuple(str(t).strip() for t in texts if str(t).strip())
    for writer in writers:
        scheme, _, ident = writer.partition(":")
        if scheme not in SCHEMES or not ident:
            raise ConfigError(
                f"{config.source}: key '{KEY_ACL_WRITERS}': {writer!r} is not digest:USER:HASH or x509:DN"
            )
    return writers


def read_zookeeper_auth(config: Config) -> ZooKeeperAuth | None:
    """The ``zookeeper.auth.*`` and ``zookeeper.acl.writers`` keys; None when none is given."""
    scheme = config.optional_str(KEY_AUTH_SCHEME)
    writers = _writers(config)
    if scheme is None and not writers:
        return None
    if scheme is not None and scheme not in SCHEMES:
        raise ConfigError(f"{config.source}: key '{KEY_AUTH_SCHEME}' must be digest or x509, got {scheme!r}")
    digest = config.optional_str(KEY_AUTH_DIGEST)
    if scheme == DIGEST and (digest is None or ":" not in digest):
        raise ConfigError(
            f"{config.source}: '{KEY_AUTH_SCHEME}: digest' needs '{KEY_AUTH_DIGEST}: user:password'"
        )
    auth = ZooKeeperAuth(
        scheme,
        digest,
        config.optional_str(KEY_AUTH_CERT_FILE),
        config.optional_str(KEY_AUTH_KEY_FILE),
        config.optional_str(KEY_AUTH_CA_FILE),
        writers,
    )
    if scheme == X509 and (auth.cert_file is None or auth.key_file is None):
        raise ConfigError(
            f"{config.source}: '{KEY_AUTH_SCHEME}: x509' needs "
            f"'{KEY_AUTH_CERT_FILE}' and '{KEY_AUTH_KEY_FILE}'"
        )
    return auth


def is_own_znode(cluster_root: str, path: str) -> bool:
    prefix = cluster_root.rstrip("/") + "/"
    if not path.startswith(prefix):
        return False
    return path[len(prefix) :].split("/", 1)[0] in OWN_ZNODES


class OwnZnodeAclClient(KazooClient):  # type: ignore[misc]
    """A kazoo client that logs in and creates our own znodes with the writers' ACL
    (:meth:`ZooKeeperAuth.own_acl`); every other znode as before (the original's open ACL).

    A process that logs in without ``zookeeper.acl.writers`` of its own gives a new znode of ours
    the ACL of its nearest existing ancestor, so that what it creates below a secured znode stays
    secured. Only the blocking ``create`` and ``ensure_path`` choose (our code creates our znodes
    with them); the ``*_async`` calls take the ACL they are given.
    """

    def __init__(self, cluster_root: str, own_acl: list[ACL] | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._own_root = cluster_root
        self._own_acl = own_acl

    def _acl_for(self, path: str, acl: Any) -> Any:
        if acl is not None or not is_own_znode(self._own_root, path):
            return acl
        if self._own_acl is not None:
            return self._own_acl
        ancestor = path.rpartition("/")[0]
        while is_own_znode(self._own_root, ancestor):
            try:
                return self.get_acls(ancestor)[0]
            except NoNodeError:
                ancestor = ancestor.rpartition("/")[0]
        return acl

    def create(self, path: str, value: bytes = b"", acl: Any = None, *args: Any, **kwargs: Any) -> Any:
        return super().create(path, value, self._acl_for(path, acl), *args, **kwargs)

    def ensure_path(self, path: str, acl: Any = None) -> Any:
        return super().ensure_path(path, self._acl_for(path, acl))


def secure_own_znodes(zk: KazooClient, cluster_root: str, settings: ZooKeeperSettings) -> bool:
    """Our own znodes created where missing and given the writers' ACL, all the way down; False
    (with a warning) when this process has no writers configured to give them."""
    auth = settings.auth
    if auth is None or not auth.writers:
        log.warning(
            "the authorizer is on but '%s' is not set: our own znodes under %s (ACLs, retention, "
            "exports, forced assignments, replica moves) stay writable by every ZooKeeper client",
            KEY_ACL_WRITERS,
            cluster_root,
        )
        return False
    acl = auth.own_acl()
    root = cluster_root.rstrip("/")
    for name in OWN_ZNODES:
        path = f"{root}/{name}"
        zk.ensure_path(path, acl=acl)
        _set_acl_tree(zk, path, acl)
    return True


def _set_acl_tree(zk: KazooClient, path: str, acl: list[ACL]) -> None:
    try:
        zk.set_acls(path, acl)
        children = zk.get_children(path)
    except NoNodeError:
        return  # gone meanwhile (an ephemeral lease)
    for child in children:
        _set_acl_tree(zk, f"{path}/{child}", acl)
