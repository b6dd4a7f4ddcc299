"""The authorizer of one node (server or storage node): who a connection is, and whether the
ACLs let it do what it asks.

On with ``authorizer.enabled: true``. Then a trust store is required (every connection presents
a certificate the node verifies), each accepted connection's principal is logged, and every
request is checked where it lands (``check``). The node's own principals
(``authorizer.nodePrincipals``: the servers' and storage nodes' certificates, which ZooKeeper's
registrations do not name) may do everything. The ACLs are watched in ZooKeeper: a change is in
force as soon as the watch fires (well under a second on a healthy ensemble), and the node's
listeners are told so that open feeds and mounts are checked again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from waltz_engine.auth.acl import NO_PARTITION, OPERATIONS, AclError, Acls, acl_path
from waltz_engine.auth.audit import DEFAULT_AGGREGATE_MS, AuditLog
from waltz_engine.auth.principal import (
    DEFAULT_RULES,
    MappingRule,
    PrincipalError,
    normalize_principal,
    parse_rules,
    principal_from_der,
)
from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.channel import FramedConnection
from waltz_engine.net.tls import TlsConfig
from waltz_engine.net.transport import peer_identity

log = logging.getLogger(__name__)

KEY_ENABLED = "authorizer.enabled"
KEY_NODE_PRINCIPALS = "authorizer.nodePrincipals"
KEY_MAPPING_RULES = "authorizer.principal.mapping.rules"
KEY_AUDIT_LOG = "authorizer.audit.log"
KEY_AUDIT_AGGREGATE = "authorizer.audit.aggregateMs"
AUTHORIZER_KEYS = (KEY_ENABLED, KEY_NODE_PRINCIPALS, KEY_MAPPING_RULES, KEY_AUDIT_LOG, KEY_AUDIT_AGGREGATE)
DEFAULT_AUDIT_LOG = "waltz-audit.log"
METRICS_GROUP = "waltz-authorizer"
# What the audit log names for a request about no one partition.
CLUSTER_RESOURCE = "cluster"


@dataclass(frozen=True)
class AuthorizerSettings:
    enabled: bool = False
    node_principals: tuple[str, ...] = ()
    rules: tuple[MappingRule, ...] = DEFAULT_RULES
    audit_log: Path | None = None
    audit_aggregate_ms: int = DEFAULT_AGGREGATE_MS


def _principal_list(config: Config, key: str) -> tuple[str, ...]:
    value = config.as_dict().get(key)
    if value is None:
        return ()
    # A YAML list, or one string of DNs separated by ';' (a DN has commas of its own).
    texts = [str(v) for v in value] if isinstance(value, list) else str(value).split(";")
    try:
        return tuple(normalize_principal(t) for t in texts if t.strip())
    except PrincipalError as e:
        raise ConfigError(f"{config.source}: key '{key}': {e}") from None


def read_authorizer_settings(config: Config, tls: TlsConfig, tls_key_prefix: str) -> AuthorizerSettings:
    """The ``authorizer.*`` keys; enabled without a trust store is a ConfigError (nobody could be
    named, so nobody could be allowed)."""
    enabled = config.get_bool(KEY_ENABLED, False)
    if not enabled:
        return AuthorizerSettings()
    if tls.trust_store_location is None:
        raise ConfigError(
            f"{config.source}: '{KEY_ENABLED}' needs '{tls_key_prefix}.ssl.trustStore.location': "
            "the authorizer names each connection by the certificate the node verifies"
        )
    rules_value = config.as_dict().get(KEY_MAPPING_RULES)
    try:
        rules = parse_rules(
            rules_value if rules_value is None or isinstance(rules_value, list) else str(rules_value)
        )
    except PrincipalError as e:
        raise ConfigError(f"{config.source}: key '{KEY_MAPPING_RULES}': {e}") from None
    return AuthorizerSettings(
        enabled=True,
        node_principals=_principal_list(config, KEY_NODE_PRINCIPALS),
        rules=rules,
        # An empty value: refusals go to the node's log only (the simulator's nodes).
        audit_log=Path(audit_log)
        if (audit_log := config.get_str(KEY_AUDIT_LOG, DEFAULT_AUDIT_LOG))
        else None,
        audit_aggregate_ms=config.get_positive(KEY_AUDIT_AGGREGATE, DEFAULT_AGGREGATE_MS),
    )


class Authorizer:
    """One node's decisions; ``start`` (with a ZooKeeper client) loads and watches the ACLs."""

    def __init__(
        self,
        settings: AuthorizerSettings,
        cluster_root: str,
        node: str,
        metrics: MetricsRegistry | None = None,
    ) -> None:
        assert settings.enabled
        self.settings = settings
        self.cluster_root = cluster_root
        self.node = node
        self.acls = Acls()
        self.version = -1
        self.audit = AuditLog(settings.audit_log, node, settings.audit_aggregate_ms)
        self._super = frozenset(settings.node_principals)
        self._listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: Any = None
        self._loop_thread = threading.get_ident()
        self._stopped = False
        self._loaded = False
        self.refusals = {op: 0 for op in OPERATIONS}
        if metrics is not None:
            for op in OPERATIONS:
                metrics.gauge(METRICS_GROUP, f"refused-{op}", lambda op=op: self.refusals[op])  # type: ignore[misc]
            metrics.gauge(METRICS_GROUP, "acl-entries", lambda: len(self.acls.entries))

    # -- the ACLs ---------------------------------------------------------------------------

    def start(self, zk: KazooClient) -> None:
        """Read the ACLs now and watch them (call from the node's event loop thread)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._loop_thread = threading.get_ident()
        # The client's own DataWatch (kazoo's recipe, or the simulator's ZooKeeper model's).
        self._watch = zk.DataWatch(acl_path(self.cluster_root), self._on_acl_data)

    def _on_acl_data(self, data: bytes | None, stat: Any) -> bool | None:
        if self._stopped:
            return False
        version = stat.version if stat is not None else -1
        try:
            acls = Acls.from_bytes(data, acl_path(self.cluster_root))
        except AclError as e:
            log.error("ACLs not changed: %s", e)  # the last good ones stay in force
            return None
        self.set_acls(acls, version)
        return None

    def set_acls(self, acls: Acls, version: int) -> None:
        before, loaded = self.acls, self._loaded
        self.acls, self.version, self._loaded = acls, version, True
        if acls == before:
            return
        added = [e.to_json() for e in acls.entries if e not in before.entries]
        removed = [e.to_json() for e in before.entries if e not in acls.entries]
        # The first read at the node's start is written too, marked: what was in force from then.
        self.audit.acl_changed(added, removed, version, initial=not loaded)
        loop = self._loop
        for listener in list(self._listeners):
            if loop is not None and not loop.is_closed() and threading.get_ident() != self._loop_thread:
                loop.call_soon_threadsafe(listener)
            else:
                listener()  # on the loop's thread already (the simulator's ZooKeeper model)

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` on the node's loop after every change of the ACLs."""
        self._listeners.append(listener)

    def stop(self) -> None:
        self._stopped = True
        self.audit.close()

    # -- connections ------------------------------------------------------------------------

    def principal_of(self, conn: FramedConnection, port: str) -> str | None:
        """The connection's principal (logged); None when its certificate maps to none."""
        identity = peer_identity(conn.writer)
        principal = identity.principal
        if principal is None and identity.certificate is not None:
            try:
                principal = principal_from_der(identity.certificate, self.settings.rules)
            except ValueError as e:
                log.warning("%s: connection from %s: unreadable certificate: %s", port, conn.peer, e)
                return None
        if principal is None:
            log.warning(
                "%s: connection from %s: no principal (no certificate, or no mapping rule applies)",
                port,
                conn.peer,
            )
        else:
            log.info("%s: connection from %s: principal %s", port, conn.peer, principal)
        return principal

    def allowed(self, principal: str | None, operation: str, partition_id: int) -> bool:
        if principal is None:
            return False
        if principal in self._super:
            return True
        return self.acls.decide(principal, operation, partition_id).allowed

    def check(
        self, principal: str | None, operation: str, partition_id: int, request: str, peer: str
    ) -> bool:
        """Whether allowed; a refusal is audited and counted."""
        if self.allowed(principal, operation, partition_id):
            return True
        self.refusals[operation] += 1
        self.audit.refused(principal or "<none>", operation, resource_name(partition_id), request, peer)
        return False


def resource_name(partition_id: int) -> str:
    return CLUSTER_RESOURCE if partition_id == NO_PARTITION else f"partition {partition_id}"
