"""Which ZooKeeper and cluster root to use, and a bounded connection to it.

Settings come from command-line values or a YAML file with the original's keys
(``zookeeper.connectString``, ``zookeeper.sessionTimeout``, ``zookeeper.connectTimeout``,
``cluster.root`` — reference §4.0), so an external ensemble works the same way as the
embedded one.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.auth.zk_acls import (
    ZOOKEEPER_AUTH_KEYS,
    OwnZnodeAclClient,
    ZooKeeperAuth,
    read_zookeeper_auth,
)
from waltz_engine.common.address import is_port
from waltz_engine.common.config import Config, ConfigError
from waltz_engine.common.errors import WaltzError
from waltz_engine.zk.paths import normalize_root

KEY_CONNECT_STRING = "zookeeper.connectString"
KEY_SESSION_TIMEOUT = "zookeeper.sessionTimeout"
KEY_CONNECT_TIMEOUT = "zookeeper.connectTimeout"
KEY_CLUSTER_ROOT = "cluster.root"
KNOWN_KEYS = (
    KEY_CONNECT_STRING,
    KEY_SESSION_TIMEOUT,
    KEY_CONNECT_TIMEOUT,
    KEY_CLUSTER_ROOT,
    *ZOOKEEPER_AUTH_KEYS,
)

DEFAULT_SESSION_TIMEOUT_MS = 30_000  # the original tools' default (TL/CliConfig.java)
DEFAULT_CONNECT_TIMEOUT_MS = 10_000
MIN_TIMEOUT_MS = 1
# How long the probe of :func:`refuse_unreachable` waits for one address to accept.
PROBE_TIMEOUT_MS = 2_000
MS_PER_S = 1000
NO_CONFIG_SOURCE = "<none>"  # the source of an empty Config: no file was given or found

# kazoo reports every failed connection attempt through logging; without a handler Python's
# last-resort handler would print them on stderr, breaking the one-line error contract.
_KAZOO_LOGGER = logging.getLogger("waltz_engine.zk.kazoo")
_KAZOO_LOGGER.addHandler(logging.NullHandler())


class ZooKeeperError(WaltzError):
    """ZooKeeper is unreachable, or refused or lost an operation."""


class ZooKeeperSettings(NamedTuple):
    connect_string: str
    cluster_root: str
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS
    # Our extension (issue 34): how this process logs in to ZooKeeper and who may write our own
    # znodes (waltz_engine/auth/zk_acls.py); None: anonymous, every znode open, as the original.
    auth: ZooKeeperAuth | None = None

    @classmethod
    def from_config(cls, config: Config) -> ZooKeeperSettings:
        return cls.resolve(config=config)

    @classmethod
    def resolve(
        cls,
        *,
        zookeeper: str | None = None,
        cluster_root: str | None = None,
        config: Config | None = None,
        session_timeout_ms: int | None = None,
        connect_timeout_ms: int | None = None,
    ) -> ZooKeeperSettings:
        """Explicit values win over the config file; both connect string and root are required."""
        from_file = config if config is not None else Config({}, NO_CONFIG_SOURCE)
        connect_string = zookeeper or from_file.optional_str(KEY_CONNECT_STRING)
        root = cluster_root or from_file.optional_str(KEY_CLUSTER_ROOT)
        if not connect_string:
            raise ZooKeeperError(_missing("--zookeeper HOST:PORT[,...]", KEY_CONNECT_STRING, config))
        if not root:
            raise ZooKeeperError(_missing("--cluster-root /PATH", KEY_CLUSTER_ROOT, config))
        session = session_timeout_ms or from_file.get_int(KEY_SESSION_TIMEOUT, DEFAULT_SESSION_TIMEOUT_MS)
        connect = connect_timeout_ms or from_file.get_int(KEY_CONNECT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT_MS)
        if session < MIN_TIMEOUT_MS or connect < MIN_TIMEOUT_MS:
            raise ZooKeeperError("ZooKeeper session and connect timeouts must be positive")
        return cls(
            _check_connect_string(connect_string),
            normalize_root(root),
            session,
            connect,
            read_zookeeper_auth(from_file),
        )


def _missing(flag: str, key: str, config: Config | None) -> str:
    if config is not None and config.source != NO_CONFIG_SOURCE:
        return f"no {key} given: pass {flag}, or add '{key}' to {config.source}"
    return (
        f"no {key} given: pass {flag} or -c FILE with '{key}' (or set WALTZ_CONFIG), "
        "or start a local cluster here with `waltz dev up`"
    )


def _check_connect_string(connect_string: str) -> str:
    hosts, _, _chroot = connect_string.partition("/")
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":")
        if not name or not port.isdigit() or not is_port(int(port)):
            raise ZooKeeperError(
                f"ZooKeeper connect string must be HOST:PORT[,HOST:PORT...], got '{connect_string}'"
            )
    return connect_string


def new_client(settings: ZooKeeperSettings) -> KazooClient:
    """A kazoo client for these settings, not started; once started, kazoo reconnects it."""
    auth = settings.auth
    if auth is None:
        return KazooClient(
            hosts=settings.connect_string,
            timeout=settings.session_timeout_ms / 1000,
            logger=_KAZOO_LOGGER,
        )
    return OwnZnodeAclClient(
        settings.cluster_root,
        auth.own_acl() if auth.writers else None,
        hosts=settings.connect_string,
        timeout=settings.session_timeout_ms / 1000,
        logger=_KAZOO_LOGGER,
        **auth.kazoo_options(),
    )


def refuse_unreachable(settings: ZooKeeperSettings) -> None:
    """A one-line :class:`ZooKeeperError` at once when no ZooKeeper address can be reached for
    certain (each refuses the connection or has no such host), where kazoo would retry for the
    whole connect timeout. An address that is slow to answer is left to kazoo's own wait."""
    hosts = [h.strip() for h in settings.connect_string.partition("/")[0].split(",")]
    probe_s = min(PROBE_TIMEOUT_MS, settings.connect_timeout_ms) / MS_PER_S
    reasons = []
    for host in hosts:
        name, _, port = host.rpartition(":")
        try:
            with socket.create_connection((name, int(port)), timeout=probe_s):
                return
        except ConnectionRefusedError:
            reasons.append(f"{host} refused the connection")
        except socket.gaierror:
            reasons.append(f"{host} is not a known host")
        except OSError:  # a timeout or an unreachable network: kazoo may still get through
            return
    raise ZooKeeperError(
        f"cannot connect to ZooKeeper at {settings.connect_string} ({'; '.join(reasons)}): "
        "is it running there? (`waltz dev up` starts a local cluster)"
    )


# How a process obtains its ZooKeeper clients (not started): production passes ``new_client``,
# the simulator its in-memory ensemble's (waltz_engine/sim/zk_model.py).
ZooKeeperConnector = Callable[[ZooKeeperSettings], KazooClient]


@contextmanager
def connect(settings: ZooKeeperSettings, connector: ZooKeeperConnector = new_client) -> Iterator[KazooClient]:
    """A started kazoo client; waits at most ``connect_timeout_ms`` and always closes it.

    Any kazoo failure escaping the block (lost connection, expired session, refused call that
    the caller did not handle) becomes a one-line :class:`ZooKeeperError`.
    """
    if connector is new_client:  # a simulated ensemble has no socket to probe
        refuse_unreachable(settings)
    client = connector(settings)
    try:
        client.start(timeout=settings.connect_timeout_ms / 1000)
    except KazooTimeoutError:  # kazoo has stopped and closed it
        raise ZooKeeperError(
            f"cannot connect to ZooKeeper at {settings.connect_string} "
            f"(no answer within {settings.connect_timeout_ms} ms)"
        ) from None
    try:
        yield client
    except KazooException as e:
        raise ZooKeeperError(f"ZooKeeper at {settings.connect_string}: {describe(e)}") from None
    finally:
        client.stop()
        client.close()


def describe(error: KazooException) -> str:
    """kazoo's exceptions often have no message; their class name says what happened."""
    detail = str(error).strip()
    name = type(error).__name__
    if name == "NoAuthError":
        return (
            "NoAuthError: ZooKeeper refused the change: this process's ZooKeeper identity may not "
            "write there (with the authorizer on, only zookeeper.acl.writers may; set "
            "zookeeper.auth.* to the operator's)"
        )
    return f"{name} ({detail})" if detail and detail != "()" else name


def node_zookeeper_settings(config: Config) -> ZooKeeperSettings:
    """A node's ZooKeeper settings: the original requires all three keys in a node's config
    (``resolve`` alone would default the session timeout)."""
    config.require_str(KEY_CONNECT_STRING)
    config.require_int(KEY_SESSION_TIMEOUT)
    config.require_str(KEY_CLUSTER_ROOT)
    try:
        return ZooKeeperSettings.from_config(config)
    except ZooKeeperError as e:
        raise ConfigError(f"{config.source}: {e}") from None


# Every ZooKeeper key a node's config may hold (for its unknown-key warning).
ZOOKEEPER_KEYS = (
    KEY_CONNECT_STRING,
    KEY_SESSION_TIMEOUT,
    KEY_CONNECT_TIMEOUT,
    KEY_CLUSTER_ROOT,
    *ZOOKEEPER_AUTH_KEYS,
)
