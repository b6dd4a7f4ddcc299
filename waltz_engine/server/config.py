"""`waltz server start` configuration: the original's keys and defaults (reference §2.1) plus
``server.host`` (bind address) and ``server.advertisedHost`` (the endpoint clients are told)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import NamedTuple

from waltz_engine.auth.authorizer import AUTHORIZER_KEYS, AuthorizerSettings, read_authorizer_settings
from waltz_engine.common.config import Config, ConfigError, require_ports
from waltz_engine.net.connection_limits import ConnectionLimits, read_connection_limits
from waltz_engine.net.tls import TlsConfig
from waltz_engine.server.feed_cache import DEFAULT_FEED_CACHE_SIZE_BYTES
from waltz_engine.server.locks import DEFAULT_LOCK_TABLE_SIZE
from waltz_engine.server.transaction_cache import DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES
from waltz_engine.zk.connection import ZOOKEEPER_KEYS, ZooKeeperSettings, node_zookeeper_settings

log = logging.getLogger(__name__)

KEY_HOST = "server.host"
KEY_ADVERTISED_HOST = "server.advertisedHost"
KEY_PORT = "server.port"
KEY_JETTY_PORT = "server.jetty.port"
KEY_REGION = "server.region"
KEY_LOCK_TABLE_SIZE = "server.optimisticLockTableSize"
KEY_FEED_CACHE_SIZE = "server.feedCacheSize"
KEY_MIN_FETCH_SIZE = "server.minFetchSize"
KEY_REALTIME_THRESHOLD = "server.realtimeThreshold"
KEY_TRANSACTION_DATA_CACHE_SIZE = "server.transactionDataCacheSize"
KEY_TRANSACTION_DATA_CACHE_ALLOCATION = "server.transactionDataCacheAllocation"
KEY_MAX_BATCH_SIZE = "storage.maxBatchSize"
KEY_INITIAL_RETRY_INTERVAL = "storage.initialRetryInterval"
KEY_MAX_RETRY_INTERVAL = "storage.maxRetryInterval"
KEY_CHECKPOINT_INTERVAL = "storage.checkpointInterval"
# Our extension (issue 31): how often a running store session tells the replicas its committed
# prefix (waltz_engine/server/store/replica_session.py); 0 leaves it to new sessions.
KEY_LOW_WATER_MARK_INTERVAL = "storage.lowWaterMark.intervalMs"
# Our extension: what the client port admits (waltz_engine/net/channel.py).
KEY_HANDSHAKE_TIMEOUT = "server.handshakeTimeout"
KEY_MAX_CONNECTIONS = "server.maxConnections"
KEY_MAX_CONNECTIONS_PER_PEER = "server.maxConnectionsPerPeer"
KEY_MAX_BUFFERED_BYTES = "server.maxBufferedBytesPerConnection"
# Our extension (issue 24): re-replication of a storage node lost for longer than the grace.
KEY_AUTO_RECOVERY_GRACE = "server.autoRecovery.graceMs"
KEY_AUTO_RECOVERY_RATE = "server.autoRecovery.bytesPerSecond"
KNOWN_KEYS = (
    KEY_HOST,
    KEY_ADVERTISED_HOST,
    KEY_PORT,
    KEY_JETTY_PORT,
    KEY_REGION,
    KEY_LOCK_TABLE_SIZE,
    KEY_FEED_CACHE_SIZE,
    KEY_MIN_FETCH_SIZE,
    KEY_REALTIME_THRESHOLD,
    KEY_TRANSACTION_DATA_CACHE_SIZE,
    KEY_TRANSACTION_DATA_CACHE_ALLOCATION,
    KEY_MAX_BATCH_SIZE,
    KEY_INITIAL_RETRY_INTERVAL,
    KEY_MAX_RETRY_INTERVAL,
    KEY_CHECKPOINT_INTERVAL,
    KEY_LOW_WATER_MARK_INTERVAL,
    KEY_HANDSHAKE_TIMEOUT,
    KEY_MAX_CONNECTIONS,
    KEY_MAX_CONNECTIONS_PER_PEER,
    KEY_MAX_BUFFERED_BYTES,
    KEY_AUTO_RECOVERY_GRACE,
    KEY_AUTO_RECOVERY_RATE,
    *ZOOKEEPER_KEYS,
    *AUTHORIZER_KEYS,
)
# TLS keys are read by TlsConfig; Graphite is accepted (as the original) but not reported to.
KNOWN_PREFIXES = ("server.ssl.", "server.graphite.")
TLS_PREFIX = "server"

DEFAULT_HOST = "0.0.0.0"
DEFAULT_MIN_FETCH_SIZE = 100
DEFAULT_REALTIME_THRESHOLD = 1000
DEFAULT_MAX_BATCH_SIZE = 100
DEFAULT_INITIAL_RETRY_INTERVAL_MS = 100
DEFAULT_MAX_RETRY_INTERVAL_MS = 20_000
DEFAULT_CHECKPOINT_INTERVAL = 250_000
DEFAULT_LOW_WATER_MARK_INTERVAL_MS = 20_000
# A node unreachable this long has its replicas moved; 0 turns re-replication off.
DEFAULT_AUTO_RECOVERY_GRACE_MS = 600_000
# Each copy's bound: a lost node's partitions copy in seconds on a dev cluster, without
# starving the appends of a production one.
DEFAULT_AUTO_RECOVERY_BYTES_PER_SECOND = 16 * 1024 * 1024
CACHE_ALLOCATIONS = ("heap", "direct")  # both mean one bytearray here; validated as the original


class StoreSettings(NamedTuple):
    """The ``storage.*`` keys the server's store layer reads (field names match StoreConfig)."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    initial_retry_interval_ms: int = DEFAULT_INITIAL_RETRY_INTERVAL_MS
    max_retry_interval_ms: int = DEFAULT_MAX_RETRY_INTERVAL_MS
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    low_water_mark_interval_ms: int = DEFAULT_LOW_WATER_MARK_INTERVAL_MS


class AutoRecoverySettings(NamedTuple):
    """``server.autoRecovery.*``: when a lost storage node's replicas move, and how fast."""

    grace_ms: int = DEFAULT_AUTO_RECOVERY_GRACE_MS
    bytes_per_second: int = DEFAULT_AUTO_RECOVERY_BYTES_PER_SECOND


class EngineSettings(NamedTuple):
    """What the partition engine and its caches need (no network, no ZooKeeper)."""

    lock_table_size: int = DEFAULT_LOCK_TABLE_SIZE
    feed_cache_size_bytes: int = DEFAULT_FEED_CACHE_SIZE_BYTES
    min_fetch_size: int = DEFAULT_MIN_FETCH_SIZE
    realtime_threshold: int = DEFAULT_REALTIME_THRESHOLD
    transaction_data_cache_size_bytes: int = DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES


class ServerConfig(NamedTuple):
    host: str
    advertised_host: str
    port: int
    jetty_port: int | None
    engine: EngineSettings
    store: StoreSettings
    zookeeper: ZooKeeperSettings
    tls: TlsConfig
    source: str
    connection_limits: ConnectionLimits = ConnectionLimits()
    auto_recovery: AutoRecoverySettings = AutoRecoverySettings()
    authorizer: AuthorizerSettings = AuthorizerSettings()

    @classmethod
    def load(cls, path: Path | str) -> ServerConfig:
        """Read and check a server YAML; every problem is a one-line ConfigError."""
        return cls.from_config(Config.load(path))

    @classmethod
    def from_config(cls, config: Config) -> ServerConfig:
        config.warn_unknown_keys(KNOWN_KEYS, log.warning, KNOWN_PREFIXES)
        src = config.source
        ports = require_ports(config, (KEY_PORT,), (KEY_JETTY_PORT,))
        jetty_port = ports.get(KEY_JETTY_PORT)

        positive = config.get_positive
        not_negative = config.get_not_negative

        engine = EngineSettings(
            lock_table_size=positive(KEY_LOCK_TABLE_SIZE, DEFAULT_LOCK_TABLE_SIZE),
            feed_cache_size_bytes=not_negative(KEY_FEED_CACHE_SIZE, DEFAULT_FEED_CACHE_SIZE_BYTES),
            min_fetch_size=positive(KEY_MIN_FETCH_SIZE, DEFAULT_MIN_FETCH_SIZE),
            realtime_threshold=positive(KEY_REALTIME_THRESHOLD, DEFAULT_REALTIME_THRESHOLD),
            transaction_data_cache_size_bytes=not_negative(
                KEY_TRANSACTION_DATA_CACHE_SIZE, DEFAULT_TRANSACTION_DATA_CACHE_SIZE_BYTES
            ),
        )
        # The original's checkConfig.
        if engine.min_fetch_size >= engine.realtime_threshold:
            raise ConfigError(
                f"{src}: '{KEY_MIN_FETCH_SIZE}' ({engine.min_fetch_size}) must be less than "
                f"'{KEY_REALTIME_THRESHOLD}' ({engine.realtime_threshold})"
            )
        allocation = config.get_str(KEY_TRANSACTION_DATA_CACHE_ALLOCATION, CACHE_ALLOCATIONS[0])
        if allocation.strip().lower() not in CACHE_ALLOCATIONS:
            raise ConfigError(
                f"{src}: key '{KEY_TRANSACTION_DATA_CACHE_ALLOCATION}' must be heap or direct, "
                f"got {allocation!r}"
            )
        store = StoreSettings(
            max_batch_size=positive(KEY_MAX_BATCH_SIZE, DEFAULT_MAX_BATCH_SIZE),
            initial_retry_interval_ms=positive(
                KEY_INITIAL_RETRY_INTERVAL, DEFAULT_INITIAL_RETRY_INTERVAL_MS, long=True
            ),
            max_retry_interval_ms=positive(KEY_MAX_RETRY_INTERVAL, DEFAULT_MAX_RETRY_INTERVAL_MS, long=True),
            checkpoint_interval=positive(KEY_CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL),
            low_water_mark_interval_ms=not_negative(
                KEY_LOW_WATER_MARK_INTERVAL, DEFAULT_LOW_WATER_MARK_INTERVAL_MS, long=True
            ),
        )
        if store.initial_retry_interval_ms > store.max_retry_interval_ms:
            raise ConfigError(
                f"{src}: '{KEY_INITIAL_RETRY_INTERVAL}' must not exceed '{KEY_MAX_RETRY_INTERVAL}'"
            )
        connection_limits = read_connection_limits(
            config,
            KEY_HANDSHAKE_TIMEOUT,
            KEY_MAX_CONNECTIONS,
            KEY_MAX_CONNECTIONS_PER_PEER,
            KEY_MAX_BUFFERED_BYTES,
        )
        zookeeper = node_zookeeper_settings(config)
        advertised = config.optional_str(KEY_ADVERTISED_HOST)
        tls = TlsConfig.from_flat(config.as_dict(), TLS_PREFIX)
        return cls(
            host=config.get_str(KEY_HOST, DEFAULT_HOST),
            # The original advertises InetAddress.getLocalHost().getCanonicalHostName().
            advertised_host=advertised if advertised else socket.getfqdn(),
            port=ports[KEY_PORT],
            jetty_port=jetty_port,
            engine=engine,
            store=store,
            zookeeper=zookeeper,
            tls=tls,
            source=src,
            connection_limits=connection_limits,
            auto_recovery=AutoRecoverySettings(
                not_negative(KEY_AUTO_RECOVERY_GRACE, DEFAULT_AUTO_RECOVERY_GRACE_MS, long=True),
                positive(KEY_AUTO_RECOVERY_RATE, DEFAULT_AUTO_RECOVERY_BYTES_PER_SECOND, long=True),
            ),
            authorizer=read_authorizer_settings(config, tls, TLS_PREFIX),
        )
