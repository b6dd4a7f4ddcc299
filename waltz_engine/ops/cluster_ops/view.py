"""What ZooKeeper says about a cluster, read once (:class:`ClusterView`), the tools' TLS,
and ``check-connectivity``."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.address import HostPort
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.tool_config import load_tool_config
from waltz_engine.server.rpc_client import ServerRpcClient, ServerRpcError
from waltz_engine.storage.admin_ops import StorageContext
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import read_cluster_params, read_partition_assignment, read_server_descriptors
from waltz_engine.zk.payloads import PartitionAssignment, PartitionMetadata, ServerDescriptor
from waltz_engine.zk.znodes import NO_VERSION

DEFAULT_VERIFY_TIMEOUT_S = 10  # ClusterCli verify's --timeout default
DEFAULT_TIMEOUT_MS = 10_000
# The original tools read TLS keys under `ssl.` in their CLI config (CliConfig.SSL_CONFIG_PREFIX).
TOOLS_SSL_PREFIX = "ssl."
_TLS_HOLDER_PREFIX = "tools"  # TlsConfig.from_flat reads `<prefix>.ssl.*`
METRICS_PATH = "/metrics"
GAUGE_NUM_PARTITIONS = "waltz-server.waltz-server-num-partitions"
GAUGE_REPLICA_INFO = "waltz-server.replica-info"
LINE_SEPARATOR = "\n"  # Java's System.lineSeparator() on the platforms Waltz ran on
NO_SERVER = 0  # server ids start at 1: 0 marks "no server yet" as the original's int[]
NO_TRANSACTION = -1


class ClusterOpsError(WaltzError):
    """A cluster operation was refused or failed; the message is one line for an operator."""


def tools_tls_config(config_path: Path | None) -> TlsConfig:
    """TLS settings for a tool's connections from ``ssl.*`` keys of its YAML (the original's
    CliConfig); without a file or keys, the original's insecure client."""
    config = load_tool_config(config_path)
    if config is None:
        return TlsConfig()
    flat = config.as_dict()
    scoped = {f"{_TLS_HOLDER_PREFIX}.{k}": v for k, v in flat.items() if k.startswith(TOOLS_SSL_PREFIX)}
    return TlsConfig.from_flat(scoped, _TLS_HOLDER_PREFIX)


def tools_ssl_context(config_path: Path | None) -> ssl.SSLContext:
    """:func:`tools_tls_config` as a context."""
    return client_context(tools_tls_config(config_path))


def java_list(values: Sequence[Any]) -> str:
    """``java.util.List.toString()``: ``[1, 2, 3]``."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def java_bool_map(values: dict[str, bool]) -> str:
    """``java.util.Map.toString()`` of storage → bool, in name order: ``{a=true, b=false}``."""
    return "{" + ", ".join(f"{k}={str(v).lower()}" for k, v in sorted(values.items())) + "}"


# --- what ZooKeeper says ---------------------------------------------------------------------


class ClusterView(NamedTuple):
    """Everything verify and check-connectivity read from ZooKeeper, read once."""

    num_partitions: int  # the cluster's (ClusterParams)
    assignment: PartitionAssignment
    servers: tuple[ServerDescriptor, ...]  # live servers, by id
    store_key: uuid.UUID
    store_num_partitions: int
    replica_assignments: dict[str, tuple[int, ...]]  # storage data connect string → partitions
    storage_admin_ports: dict[str, int]  # storage data connect string → admin port
    partition_metadata: dict[int, PartitionMetadata | None]  # None: no znode, or unreadable

    def partitions_of(self, server_id: int) -> list[int]:
        return [
            p.partition_id for s in self.assignment.servers if s.server_id == server_id for p in s.partitions
        ]

    def replicas_of(self, partition_id: int) -> set[str]:
        return {storage for storage, ids in self.replica_assignments.items() if partition_id in ids}

    def storage_context(self, ssl_context: ssl.SSLContext, timeout_ms: int) -> StorageContext:
        return StorageContext(self.store_key, self.store_num_partitions, ssl_context, timeout_ms)


def _metadata_or_none(client: KazooClient, root: str, partition_id: int) -> PartitionMetadata | None:
    try:
        found = store_metadata.read_partition_metadata(client, root, partition_id)
    except WaltzError:
        return None
    return None if found.version == NO_VERSION else found.metadata


def read_cluster_view(client: KazooClient, root: str) -> ClusterView:
    num_partitions = read_cluster_params(client, root).num_partitions
    params = store_metadata.read_store_params(client, root)
    return ClusterView(
        num_partitions,
        read_partition_assignment(client, root),
        read_server_descriptors(client, root),
        params.key,
        params.num_partitions,
        store_metadata.read_replica_assignments(client, root).as_dict(),
        store_metadata.read_connection_metadata(client, root).as_dict(),
        {p: _metadata_or_none(client, root, p) for p in range(num_partitions)},
    )


def descriptor_endpoint(descriptor: ServerDescriptor) -> HostPort:
    return HostPort(descriptor.host, descriptor.port)


# --- check-connectivity ------------------------------------------------------------------------


class ServerConnectivity(NamedTuple):
    server_id: int
    endpoint: str
    storages: dict[str, bool] | None  # None: the server did not answer (UNREACHABLE)
    error: str | None

    def line(self) -> str:
        """The original's output line."""
        status = "UNREACHABLE" if self.storages is None else java_bool_map(self.storages)
        return f"Connectivity status of {self.endpoint} is: {status}"

    def to_json(self) -> dict[str, Any]:
        return {
            "server_id": self.server_id,
            "endpoint": self.endpoint,
            "reachable": self.storages is not None,
            "storages": self.storages,
            "error": self.error,
        }


async def check_connectivity(
    view: ClusterView, ssl_context: ssl.SSLContext, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> list[ServerConnectivity]:
    """Message 13 to every live server: can it open every storage node of the assignment?"""

    async def ask(descriptor: ServerDescriptor) -> ServerConnectivity:
        try:
            async with ServerRpcClient(
                descriptor_endpoint(descriptor), ssl_context, timeout_ms=timeout_ms
            ) as rpc:
                storages = await rpc.check_storage_connectivity()
        except ServerRpcError as e:
            return ServerConnectivity(descriptor.server_id, descriptor.endpoint, None, str(e))
        return ServerConnectivity(descriptor.server_id, descriptor.endpoint, storages, None)

    return list(await asyncio.gather(*(ask(d) for d in view.servers)))
