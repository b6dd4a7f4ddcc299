"""Client configuration: the original's keys and defaults (``WaltzClientConfig``, §3.2).

Timeouts the original hard-codes are fields here with the original's values, so tests and
impatient applications can shorten them; they are not YAML keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from waltz_engine.client.backoff import RECONNECT_BACKOFF_INITIAL_MS, RECONNECT_BACKOFF_MAX_MS
from waltz_engine.common.config import Config, ConfigError, resolve_config_path
from waltz_engine.net.tls import TlsConfig
from waltz_engine.zk.connection import ZooKeeperSettings

if TYPE_CHECKING:
    from waltz_engine.client.driver import WaltzClientDriver

KEY_AUTO_MOUNT = "client.autoMount"
KEY_NUM_TRANSACTION_RETRY_THREADS = "client.numTransactionRetryThreads"
KEY_NUM_CONSUMER_THREADS = "client.numConsumerThreads"
KEY_LONG_WAIT_THRESHOLD = "client.longWaitThreshold"
KEY_MAX_CONCURRENT_TRANSACTIONS = "client.maxConcurrentTransactions"
KEY_MOCK_DRIVER = "client.mockDriver"
# Ours (issue 14): bytes of transaction data asked for ahead of apply_transaction, per partition.
KEY_DATA_PREFETCH_BYTES = "client.dataPrefetchBytes"
KNOWN_KEYS = (
    KEY_AUTO_MOUNT,
    KEY_NUM_TRANSACTION_RETRY_THREADS,
    KEY_NUM_CONSUMER_THREADS,
    KEY_LONG_WAIT_THRESHOLD,
    KEY_MAX_CONCURRENT_TRANSACTIONS,
    KEY_MOCK_DRIVER,
    KEY_DATA_PREFETCH_BYTES,
)

DEFAULT_AUTO_MOUNT = True
DEFAULT_NUM_TRANSACTION_RETRY_THREADS = 1
DEFAULT_NUM_CONSUMER_THREADS = 10
DEFAULT_LONG_WAIT_THRESHOLD_MS = 5_000
DEFAULT_MAX_CONCURRENT_TRANSACTIONS = 5
# Per partition; 0 turns prefetching off (one round trip per Transaction.data(), as the original).
DEFAULT_DATA_PREFETCH_BYTES = 1024 * 1024

# The original's internal constants (CL/internal/Partition.java, InternalBaseClient.java).
REGISTRATION_TIMEOUT_MS = 10_000
ENSURE_MOUNTED_TIMEOUT_MS = 10_000
NOT_READY_RETRY_MS = 500
# Ours: the original reconnects after 1 s (failed connect) or at once (dropped connection);
# here both back off exponentially with jitter from the first delay to the cap (client/backoff.py).
RECONNECT_DELAY_MS = RECONNECT_BACKOFF_INITIAL_MS
RECONNECT_MAX_DELAY_MS = RECONNECT_BACKOFF_MAX_MS
# Ours: the original waits for RPC answers and flushes without a bound.
RPC_TIMEOUT_MS = 10_000
FLUSH_TIMEOUT_MS = 10_000
# Ours: the client's own retries of one context in a row that could not be sent, because no
# server served its partition within the mount or registration bound (a failover outlasting
# them: a ZooKeeper session's expiry, then a recovery), before the context fails with that
# ClientTimeoutError. Each such retry waits its bound first, so six outlast a minute of failover.
# A submit's own attempt still raises it to its caller, as the original does.
MAX_UNSENT_RETRIES = 6
# Tries of one transaction (the first and the re-feeds after reconnects) before the client
# stops the partition and says why through uncaught_exception (the original retries for ever).
MAX_APPLICATION_ATTEMPTS = 5


@dataclass(frozen=True)
class WaltzClientConfig:
    zookeeper: ZooKeeperSettings | None = None
    auto_mount: bool = DEFAULT_AUTO_MOUNT
    num_transaction_retry_threads: int = DEFAULT_NUM_TRANSACTION_RETRY_THREADS
    num_consumer_threads: int = DEFAULT_NUM_CONSUMER_THREADS
    long_wait_threshold_ms: int = DEFAULT_LONG_WAIT_THRESHOLD_MS
    max_concurrent_transactions: int = DEFAULT_MAX_CONCURRENT_TRANSACTIONS
    data_prefetch_bytes: int = DEFAULT_DATA_PREFETCH_BYTES
    tls: TlsConfig = field(default_factory=TlsConfig)
    mock_driver: WaltzClientDriver | None = None
    registration_timeout_ms: int = REGISTRATION_TIMEOUT_MS
    ensure_mounted_timeout_ms: int = ENSURE_MOUNTED_TIMEOUT_MS
    not_ready_retry_ms: int = NOT_READY_RETRY_MS
    reconnect_delay_ms: int = RECONNECT_DELAY_MS  # the reconnect backoff's first delay
    reconnect_max_delay_ms: int = RECONNECT_MAX_DELAY_MS  # and its cap
    # Tries of one transaction by apply_transaction before the client stops the partition.
    max_application_attempts: int = MAX_APPLICATION_ATTEMPTS
    rpc_timeout_ms: int = RPC_TIMEOUT_MS
    flush_timeout_ms: int = FLUSH_TIMEOUT_MS
    max_unsent_retries: int = MAX_UNSENT_RETRIES
    # Server endpoint as the cluster publishes it ("host:port") -> the address to connect to
    # instead, e.g. a TCP proxy or an SSH tunnel (the original's tests swap in a ProxyClientDriver).
    endpoint_overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mock_driver is None and self.zookeeper is None:
            raise ConfigError(
                "a Waltz client needs zookeeper.connectString and cluster.root (or a mock driver)"
            )
        for name in (
            "num_consumer_threads",
            "long_wait_threshold_ms",
            "max_concurrent_transactions",
            "max_application_attempts",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_unsent_retries < 0:
            raise ConfigError(f"max_unsent_retries must not be negative, got {self.max_unsent_retries}")
        if self.num_transaction_retry_threads < 0:
            raise ConfigError("client.numTransactionRetryThreads must not be negative")
        if self.data_prefetch_bytes < 0:
            raise ConfigError(f"{KEY_DATA_PREFETCH_BYTES} must not be negative")

    @classmethod
    def from_config(
        cls,
        config: Config | Mapping[str, Any],
        mock_driver: WaltzClientDriver | None = None,
        **overrides: Any,
    ) -> WaltzClientConfig:
        """The original's keys from a YAML config (or a dot-keyed mapping); ``overrides`` win."""
        conf = config if isinstance(config, Config) else Config(config, "<client config>")
        driver = mock_driver if mock_driver is not None else conf.as_dict().get(KEY_MOCK_DRIVER)
        zookeeper = None
        if "zookeeper" not in overrides and (
            driver is None or conf.optional_str("zookeeper.connectString") is not None
        ):
            zookeeper = ZooKeeperSettings.from_config(conf)
        values: dict[str, Any] = {
            "zookeeper": zookeeper,
            "auto_mount": conf.get_bool(KEY_AUTO_MOUNT, DEFAULT_AUTO_MOUNT),
            "num_transaction_retry_threads": conf.get_int(
                KEY_NUM_TRANSACTION_RETRY_THREADS, DEFAULT_NUM_TRANSACTION_RETRY_THREADS
            ),
            "num_consumer_threads": conf.get_int(KEY_NUM_CONSUMER_THREADS, DEFAULT_NUM_CONSUMER_THREADS),
            "long_wait_threshold_ms": conf.get_long(KEY_LONG_WAIT_THRESHOLD, DEFAULT_LONG_WAIT_THRESHOLD_MS),
            "max_concurrent_transactions": conf.get_int(
                KEY_MAX_CONCURRENT_TRANSACTIONS, DEFAULT_MAX_CONCURRENT_TRANSACTIONS
            ),
            "data_prefetch_bytes": conf.get_long(KEY_DATA_PREFETCH_BYTES, DEFAULT_DATA_PREFETCH_BYTES),
            "tls": TlsConfig.from_flat(conf.as_dict(), "client"),
            "mock_driver": driver,
        }
        values.update(overrides)
        return cls(**values)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        zookeeper: str | None = None,
        cluster_root: str | None = None,
        **overrides: Any,
    ) -> WaltzClientConfig:
        """A client's configuration in one call, found as the ``waltz`` commands find it.

        ``path``: a client YAML (the original's keys). ``zookeeper``/``cluster_root``: the
        cluster, winning over the file's keys. With neither a path nor both of them, the nearest
        dev cluster's ``.waltz-dev/client.yml`` (here or in a directory above) is used.
        ``overrides`` set fields directly (``flush_timeout_ms=...``).
        """
        file = resolve_config_path(Path(path) if path is not None else None)
        if file is None and not (zookeeper and cluster_root):
            raise ConfigError(
                "no Waltz cluster given: pass a client YAML path, or zookeeper= and cluster_root=, "
                "or run below a directory where `waltz dev up` started one (.waltz-dev/client.yml)"
            )
        conf = Config.load(file) if file is not None else Config({}, "<client arguments>")
        if zookeeper or cluster_root:
            overrides.setdefault(
                "zookeeper",
                ZooKeeperSettings.resolve(zookeeper=zookeeper, cluster_root=cluster_root, config=conf),
            )
        return cls.from_config(conf, **overrides)


ConfigSource = WaltzClientConfig | str | os.PathLike[str] | None


def client_config(
    config: ConfigSource, zookeeper: str | None = None, cluster_root: str | None = None
) -> WaltzClientConfig:
    """What a client constructor was given: a config as it is, else :meth:`WaltzClientConfig.load`."""
    if isinstance(config, WaltzClientConfig):
        if zookeeper or cluster_root:
            raise ConfigError("give either a WaltzClientConfig or zookeeper=/cluster_root=, not both")
        return config
    return WaltzClientConfig.load(config, zookeeper=zookeeper, cluster_root=cluster_root)
