"""`waltz storage start` configuration: the original's keys (reference §1.1) plus `storage.host`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from waltz_engine.auth.authorizer import AUTHORIZER_KEYS, AuthorizerSettings, read_authorizer_settings
from waltz_engine.common.config import Config, ConfigError, require_ports
from waltz_engine.net.connection_limits import ConnectionLimits, read_connection_limits
from waltz_engine.net.tls import TlsConfig
from waltz_engine.storage.cleaner import DEFAULT_RETENTION_CHECK_INTERVAL_MS
from waltz_engine.storage.constants import (
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
)
from waltz_engine.storage.node.connection_threads import MAX_CONNECTION_THREADS
from waltz_engine.storage.node.scrubber import DEFAULT_SCRUB_BYTES_PER_SECOND
from waltz_engine.storage.tier.settings import TIER_KEYS, TierSettings, read_tier_settings
from waltz_engine.zk.connection import ZOOKEEPER_KEYS, ZooKeeperSettings, node_zookeeper_settings

log = logging.getLogger(__name__)

KEY_HOST = "storage.host"
KEY_PORT = "storage.port"
KEY_ADMIN_PORT = "storage.admin.port"
KEY_JETTY_PORT = "storage.jetty.port"
KEY_DIRECTORY = "storage.directory"
KEY_SEGMENT_SIZE_THRESHOLD = "storage.segment.size.threshold"
KEY_SEGMENT_CACHE_CAPACITY = "storage.segment.cache.capacity"
# Our extension: how often the retention cleaner re-reads the bounds (waltz_engine/retention.py).
KEY_RETENTION_CHECK_INTERVAL = "storage.retention.check.interval.ms"
# Our extension: what the data and admin ports admit together (waltz_engine/net/channel.py).
KEY_HANDSHAKE_TIMEOUT = "storage.handshake.timeout.ms"
KEY_MAX_CONNECTIONS = "storage.max.connections"
KEY_MAX_CONNECTIONS_PER_PEER = "storage.max.connections.per.peer"
KEY_MAX_BUFFERED_BYTES = "storage.max.buffered.bytes.per.connection"
# Our extension: how long a starting node keeps trying to reach ZooKeeper before it gives up (a
# new directory only: a formatted one starts from its control file, see cluster_identity).
KEY_ZOOKEEPER_START_TIMEOUT = "storage.zookeeper.start.timeout.ms"
DEFAULT_ZOOKEEPER_START_TIMEOUT_MS = 60_000
# Our extension: how fast the background scrub reads every record (0: no scrub).
KEY_SCRUB_BYTES_PER_SECOND = "storage.scrub.bytes.per.second"
# Our extension (issue 33): data connections a thread of their own may read, at most
# MAX_CONNECTION_THREADS (0: the event loop reads every one).
KEY_DATA_CONNECTION_THREADS = "storage.data.connection.threads"
# Our extension (issue 33): how a disk pass of several partitions makes them durable: "auto" one
# syncfs where that is safe (syncfs.py), else each file's own sync; "file" always each file's own;
# "file-system" always one syncfs (the operator vouches for the kernel and file system).
KEY_SYNC_SCOPE = "storage.sync.scope"
SYNC_SCOPE_AUTO, SYNC_SCOPE_FILE, SYNC_SCOPE_FILE_SYSTEM = "auto", "file", "file-system"
SYNC_SCOPES = (SYNC_SCOPE_AUTO, SYNC_SCOPE_FILE, SYNC_SCOPE_FILE_SYSTEM)
KNOWN_KEYS = (
    KEY_HOST,
    KEY_PORT,
    KEY_ADMIN_PORT,
    KEY_JETTY_PORT,
    KEY_DIRECTORY,
    KEY_SEGMENT_SIZE_THRESHOLD,
    KEY_SEGMENT_CACHE_CAPACITY,
    KEY_RETENTION_CHECK_INTERVAL,
    KEY_HANDSHAKE_TIMEOUT,
    KEY_MAX_CONNECTIONS,
    KEY_MAX_CONNECTIONS_PER_PEER,
    KEY_MAX_BUFFERED_BYTES,
    KEY_ZOOKEEPER_START_TIMEOUT,
    KEY_SCRUB_BYTES_PER_SECOND,
    KEY_DATA_CONNECTION_THREADS,
    KEY_SYNC_SCOPE,
    *TIER_KEYS,
    *ZOOKEEPER_KEYS,
    *AUTHORIZER_KEYS,
)
# TLS keys are read by TlsConfig; Graphite is accepted (as the original) but not reported to.
KNOWN_PREFIXES = ("storage.ssl.", "storage.graphite.")
TLS_PREFIX = "storage"

DEFAULT_HOST = "0.0.0.0"


class StorageConfig(NamedTuple):
    host: str
    port: int
    admin_port: int
    jetty_port: int | None
    directory: Path
    segment_size_threshold_bytes: int
    segment_cache_capacity: int
    zookeeper: ZooKeeperSettings
    tls: TlsConfig
    source: str
    retention_check_interval_ms: int = DEFAULT_RETENTION_CHECK_INTERVAL_MS
    connection_limits: ConnectionLimits = ConnectionLimits()
    zookeeper_start_timeout_ms: int = DEFAULT_ZOOKEEPER_START_TIMEOUT_MS
    scrub_bytes_per_second: int = DEFAULT_SCRUB_BYTES_PER_SECOND
    # Our extension: sealed segments in an object store (None: off).
    tier: TierSettings | None = None
    # Our extension (issue 34): ACLs on TLS identities (None of it unless enabled).
    authorizer: AuthorizerSettings = AuthorizerSettings()
    data_connection_threads: int = MAX_CONNECTION_THREADS
    sync_scope: str = SYNC_SCOPE_AUTO

    @classmethod
    def load(cls, path: Path | str) -> StorageConfig:
        """Read and check a storage YAML; every problem is a one-line ConfigError."""
        return cls.from_config(Config.load(path))

    @classmethod
    def from_config(cls, config: Config) -> StorageConfig:
        config.warn_unknown_keys(KNOWN_KEYS, log.warning, KNOWN_PREFIXES)
        src = config.source
        ports = require_ports(config, (KEY_PORT, KEY_ADMIN_PORT), (KEY_JETTY_PORT,))
        threshold = config.get_positive(
            KEY_SEGMENT_SIZE_THRESHOLD, DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES, long=True
        )
        capacity = config.get_not_negative(KEY_SEGMENT_CACHE_CAPACITY, DEFAULT_SEGMENT_CACHE_CAPACITY)
        retention_interval_ms = config.get_positive(
            KEY_RETENTION_CHECK_INTERVAL, DEFAULT_RETENTION_CHECK_INTERVAL_MS, long=True
        )
        directory = config.require_str(KEY_DIRECTORY)
        if not directory.strip():
            raise ConfigError(f"{src}: key '{KEY_DIRECTORY}' must not be empty")
        host = config.get_str(KEY_HOST, DEFAULT_HOST)
        connection_limits = read_connection_limits(
            config,
            KEY_HANDSHAKE_TIMEOUT,
            KEY_MAX_CONNECTIONS,
            KEY_MAX_CONNECTIONS_PER_PEER,
            KEY_MAX_BUFFERED_BYTES,
        )
        zookeeper = node_zookeeper_settings(config)
        zookeeper_start_timeout_ms = config.get_positive(
            KEY_ZOOKEEPER_START_TIMEOUT, DEFAULT_ZOOKEEPER_START_TIMEOUT_MS, long=True
        )
        scrub_bytes_per_second = config.get_not_negative(
            KEY_SCRUB_BYTES_PER_SECOND, DEFAULT_SCRUB_BYTES_PER_SECOND, long=True
        )
        data_connection_threads = config.get_not_negative(KEY_DATA_CONNECTION_THREADS, MAX_CONNECTION_THREADS)
        if data_connection_threads > MAX_CONNECTION_THREADS:
            raise ConfigError(
                f"{src}: key '{KEY_DATA_CONNECTION_THREADS}' is {data_connection_threads}: at most "
                f"{MAX_CONNECTION_THREADS} (0: the event loop reads every data connection)"
            )
        sync_scope = config.get_str(KEY_SYNC_SCOPE, SYNC_SCOPE_AUTO)
        if sync_scope not in SYNC_SCOPES:
            raise ConfigError(
                f"{src}: key '{KEY_SYNC_SCOPE}' is '{sync_scope}': one of {', '.join(SYNC_SCOPES)} "
                f"({SYNC_SCOPE_AUTO}: one syncfs per disk pass where the kernel and file system make it safe)"
            )
        tls = TlsConfig.from_flat(config.as_dict(), TLS_PREFIX)
        return cls(
            host=host,
            port=ports[KEY_PORT],
            admin_port=ports[KEY_ADMIN_PORT],
            jetty_port=ports.get(KEY_JETTY_PORT),
            directory=Path(directory),
            segment_size_threshold_bytes=threshold,
            segment_cache_capacity=capacity,
            zookeeper=zookeeper,
            tls=tls,
            source=src,
            retention_check_interval_ms=retention_interval_ms,
            connection_limits=connection_limits,
            zookeeper_start_timeout_ms=zookeeper_start_timeout_ms,
            scrub_bytes_per_second=scrub_bytes_per_second,
            tier=read_tier_settings(config),
            authorizer=read_authorizer_settings(config, tls, TLS_PREFIX),
            data_connection_threads=data_connection_threads,
            sync_scope=sync_scope,
        )
