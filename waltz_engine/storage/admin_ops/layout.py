"""Where the storage nodes are (:class:`StoreLayout`, read from ZooKeeper once), how a
command names one (data or admin address), and the context every operation runs in.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from kazoo.client import KazooClient

from waltz_engine.common.address import HostPort, parse_host_port
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.zk import store_metadata
from waltz_engine.zk.partition_ranges import format_partition_ranges

T = TypeVar("T")

# Connect + TLS + Hello + OPEN, and then every single request, must answer within this.
DEFAULT_TIMEOUT_MS = 10_000
# The original's StorageRecoveryRunnable.MAX_BATCH_SIZE.
DEFAULT_RECOVERY_BATCH_SIZE = 20
# One RECORD_LIST answer is held in memory and re-sent as one APPEND frame.
MAX_RECOVERY_BATCH_SIZE = 10_000
# A dropped connection or a timeout restarts the recovery from the destination's last
# low-water mark (set after every batch), at most this many times in all.
RECOVERY_MAX_ATTEMPTS = 3
RECOVERY_RETRY_BACKOFF_MS = 200
# The original logs recovery progress every this many transactions.
RECOVERY_LOG_INTERVAL_TXNS = 10_000

# The original's StorageCli reads its TLS keys under `server.ssl.` (WaltzServerConfig's prefix).
SSL_CONFIG_PREFIX = "server"
GAUGE_PARTITION_IDS = "waltz-storage.waltz-storage-partition-ids"
NO_TRANSACTION = -1


class StorageAdminError(WaltzError):
    """An admin operation failed: bad input, an unreachable node, or the node's FAILURE answer."""


# What ``--storage`` of the admin commands takes: a node's data address as registered in
# ZooKeeper, or its admin address (the original's StorageCli form).
STORAGE_ADDRESS_FORM = "host:port (the data address as registered, or host:admin_port)"


def parse_admin_address(text: str) -> HostPort:
    """A storage node's ``host:admin_port``, as the original's StorageCli takes ``--storage``."""
    return parse_host_port(text, "Storage", "host:admin_port")


def parse_storage_address(text: str) -> HostPort:
    """A storage node's data or admin address, ``host:port`` (see :meth:`StoreLayout.resolve_node`)."""
    return parse_host_port(text, "Storage", STORAGE_ADDRESS_FORM)


class StorageNode(NamedTuple):
    """Where one storage node answers: its admin port, and its data port when known."""

    admin: HostPort
    data: HostPort | None  # None: an admin address of a node not registered in ZooKeeper
    storage: str | None  # its data connect string as registered in ZooKeeper, if it is

    def data_port(self, explicit: int | None = None) -> int:
        """``explicit`` (``--storage-port``), else the registered data port."""
        if explicit is not None:
            return explicit
        if self.data is None:
            raise StorageAdminError(
                f"storage node {self.admin} is not registered in ZooKeeper (store/connection): "
                "pass its data address as registered, or its data port with --storage-port"
            )
        return self.data.port


@dataclass(frozen=True)
class StorageContext:
    """What every connection to a storage node of one cluster needs. ``network`` is the seam
    the connections go through (the simulator's in-memory network, where ``ssl_context`` is None)."""

    key: uuid.UUID
    num_partitions: int
    ssl_context: ssl.SSLContext | None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    network: Network = ASYNCIO_NETWORK

    def __post_init__(self) -> None:
        assert self.num_partitions >= 0
        if self.timeout_ms <= 0:
            raise StorageAdminError(f"timeout must be positive, got {self.timeout_ms} ms")

    def check_partitions(self, partition_ids: Sequence[int]) -> list[int]:
        return check_partitions(partition_ids, self.num_partitions)


def check_partitions(partition_ids: Sequence[int], num_partitions: int) -> list[int]:
    """Sorted, unique ids, all inside the cluster (message as ``ZooKeeperCli``'s)."""
    ids = sorted(set(partition_ids))
    if not ids:
        raise StorageAdminError("no partition given")
    if ids[0] < 0 or ids[-1] >= num_partitions:
        if not num_partitions:
            raise StorageAdminError("the cluster has no partitions")
        outside = format_partition_ranges([p for p in ids if not 0 <= p < num_partitions])
        raise StorageAdminError(
            f"One or more partition(s) in [{ids[0]}, {ids[-1]}] does not belong to the cluster: "
            f"{outside} (the cluster has partitions 0-{num_partitions - 1})"
        )
    return ids


def client_tls_config(ssl_config: Path | None) -> TlsConfig:
    """TLS settings for connections to storage nodes from ``server.ssl.*`` keys of a YAML file;
    without a file (or keys), the original's insecure client (no server verification)."""
    if ssl_config is None:
        return TlsConfig()
    return TlsConfig.from_flat(Config.load(ssl_config).as_dict(), SSL_CONFIG_PREFIX)


def client_ssl_context(ssl_config: Path | None) -> ssl.SSLContext:
    """:func:`client_tls_config` as a context."""
    return client_context(client_tls_config(ssl_config))


class StoreLayout(NamedTuple):
    """The storage part of a cluster's ZooKeeper metadata, read once."""

    key: uuid.UUID
    num_partitions: int
    assignments: dict[str, tuple[int, ...]]  # data connect string → partitions (store/assignment)
    groups: dict[str, int]  # data connect string → group (store/group)
    admin_ports: dict[str, int]  # data connect string → admin port (store/connection)

    def context(
        self,
        ssl_context: ssl.SSLContext | None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        network: Network = ASYNCIO_NETWORK,
    ) -> StorageContext:
        return StorageContext(self.key, self.num_partitions, ssl_context, timeout_ms, network)

    def admin_address(self, storage: str) -> HostPort:
        """The original takes the host of the data connect string and the registered admin port."""
        port = self.admin_ports.get(storage)
        if port is None:
            raise StorageAdminError(
                f"storage node {storage} has no admin port in ZooKeeper (store/connection)"
            )
        return HostPort(parse_host_port(storage).host, port)

    def resolve_node(self, text: str) -> StorageNode:
        """A node named by its data address as registered (admin port from store/connection)
        or by its admin address; an address that matches neither is taken as an admin
        address, as the original's StorageCli does."""
        address = parse_storage_address(text)
        registered = {*self.admin_ports, *self.groups, *self.assignments}
        for storage in sorted(registered):
            if _same_address(storage, address):
                return StorageNode(self.admin_address(storage), parse_host_port(storage), storage)
        for storage, admin_port in sorted(self.admin_ports.items()):
            data = _registered_address(storage)
            if data is not None and data.host.lower() == address.host.lower() and admin_port == address.port:
                return StorageNode(address, data, storage)
        return StorageNode(address, None, None)


def _registered_address(storage: str) -> HostPort | None:
    try:
        return parse_host_port(storage)
    except WaltzError:
        return None


def _same_address(storage: str, address: HostPort) -> bool:
    registered = _registered_address(storage)
    return registered is not None and (registered.host.lower(), registered.port) == (
        address.host.lower(),
        address.port,
    )


def read_store_layout(client: KazooClient, root: str) -> StoreLayout:
    params = store_metadata.read_store_params(client, root)
    return StoreLayout(
        params.key,
        params.num_partitions,
        store_metadata.read_replica_assignments(client, root).as_dict(),
        store_metadata.read_group_descriptor(client, root).as_dict(),
        store_metadata.read_connection_metadata(client, root).as_dict(),
    )
