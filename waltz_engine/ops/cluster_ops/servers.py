"""Server administration: ``server list`` (HTTP /metrics), preferred partitions (§4.3), forced assignment."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.address import HostPort
from waltz_engine.ops.cluster_ops.view import (
    DEFAULT_TIMEOUT_MS,
    GAUGE_NUM_PARTITIONS,
    GAUGE_REPLICA_INFO,
    METRICS_PATH,
    ClusterOpsError,
    descriptor_endpoint,
    java_list,
)
from waltz_engine.server.rpc_client import ServerRpcClient
from waltz_engine.zk.cluster import read_cluster_params, read_server_descriptors
from waltz_engine.zk.cluster_manager import force_assign, force_unassign, read_forced_assignments
from waltz_engine.zk.partition_ranges import not_in_cluster
from waltz_engine.zk.payloads import ServerDescriptor

# --- server list (HTTP /metrics) -----------------------------------------------------------------


class ServerPartitionList(NamedTuple):
    endpoint: str
    num_partitions: int
    replicas: dict[int, list[str]]  # partition → storage connect strings

    def lines(self) -> list[str]:
        """The original ``ServerCli list`` output."""
        lines = [f"There are {self.num_partitions} partitions for current server"]
        lines += [f"Storage node for partition {p}: {java_list(s)}" for p, s in sorted(self.replicas.items())]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.endpoint,
            "num_partitions": self.num_partitions,
            "partitions": [{"partition": p, "storage_nodes": s} for p, s in sorted(self.replicas.items())],
        }


def server_list(endpoint: HostPort, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ServerPartitionList:
    """The partitions a server holds and their storage nodes, from its ``/metrics`` gauges."""
    url = f"http://{endpoint}{METRICS_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_ms / 1000) as response:  # noqa: S310 (http only)
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ClusterOpsError(f"Cannot read metrics of server {endpoint} ({url}): {reason}") from None
    gauges = body.get("gauges") if isinstance(body, dict) else None
    if not isinstance(gauges, dict):
        raise ClusterOpsError(f"{url} has no gauges: is {endpoint} a Waltz server's jetty port?")
    count = (gauges.get(GAUGE_NUM_PARTITIONS) or {}).get("value")
    info = (gauges.get(GAUGE_REPLICA_INFO) or {}).get("value")
    if not isinstance(count, int) or not isinstance(info, dict):
        raise ClusterOpsError(
            f"{url} lacks {GAUGE_NUM_PARTITIONS} or {GAUGE_REPLICA_INFO}: not a Waltz server?"
        )
    try:
        replicas = {int(p): [str(s) for s in storages] for p, storages in info.items()}
    except (TypeError, ValueError):
        raise ClusterOpsError(f"{url}: {GAUGE_REPLICA_INFO} is not partition → storage nodes") from None
    return ServerPartitionList(str(endpoint), count, replicas)


# --- preferred partitions --------------------------------------------------------------------------


async def add_preferred_partitions(
    endpoint: HostPort,
    partition_ids: Sequence[int],
    ssl_context: ssl.SSLContext,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> None:
    """Message 17; the server's refusal is the original's error message."""
    async with ServerRpcClient(endpoint, ssl_context, timeout_ms=timeout_ms) as rpc:
        accepted = await rpc.add_preferred_partitions(partition_ids)
    if not accepted:
        raise ClusterOpsError(
            f"Failed to add preferred partition(s) {java_list(partition_ids)} to server Endpoint {endpoint}."
        )


async def remove_preferred_partitions(
    endpoint: HostPort,
    partition_ids: Sequence[int],
    ssl_context: ssl.SSLContext,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> None:
    """Message 19; the server's refusal is the original's error message."""
    async with ServerRpcClient(endpoint, ssl_context, timeout_ms=timeout_ms) as rpc:
        accepted = await rpc.remove_preferred_partitions(partition_ids)
    if not accepted:
        raise ClusterOpsError(
            f"Failed to remove preferred partition {java_list(partition_ids)} "
            f"from server Endpoint {endpoint}."
        )


# --- forced assignment (the original's issue #6) --------------------------------------------------


class ForcedAssignment(NamedTuple):
    partition_id: int
    server_id: int | None  # None: handed back to the assignment policy
    endpoint: str | None
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition_id,
            "server_id": self.server_id,
            "endpoint": self.endpoint,
            "changed": self.changed,
        }


def check_partition_in_cluster(client: KazooClient, root: str, partition_id: int) -> None:
    num_partitions = read_cluster_params(client, root).num_partitions
    if not 0 <= partition_id < num_partitions:
        raise ClusterOpsError(not_in_cluster([partition_id], num_partitions))


def live_server(client: KazooClient, root: str, server_id: int) -> ServerDescriptor:
    """The descriptor of a live server (registered in ZooKeeper) by its id."""
    live = {d.server_id: d for d in read_server_descriptors(client, root)}
    if server_id not in live:
        ids = ", ".join(str(s) for s in sorted(live)) or "none"
        raise ClusterOpsError(
            f"Server {server_id} is not a live server of the cluster (live server ids: {ids})"
        )
    return live[server_id]


def server_endpoint(client: KazooClient, root: str, server_id: int) -> HostPort:
    """Where a live server takes clients (its client port), by its id."""
    return descriptor_endpoint(live_server(client, root, server_id))


def assign_partition(client: KazooClient, root: str, partition_id: int, server_id: int) -> ForcedAssignment:
    """Pin a partition to a live server; the coordinator moves it (new generation) at once."""
    check_partition_in_cluster(client, root, partition_id)
    descriptor = live_server(client, root, server_id)
    changed = force_assign(client, root, partition_id, server_id)
    return ForcedAssignment(partition_id, server_id, descriptor.endpoint, changed)


def unassign_partition(client: KazooClient, root: str, partition_id: int) -> ForcedAssignment:
    """Hand a forced partition back to the assignment policy (``changed`` False if it was not forced)."""
    check_partition_in_cluster(client, root, partition_id)
    changed = force_unassign(client, root, partition_id)
    return ForcedAssignment(partition_id, None, None, changed)


def forced_assignments(client: KazooClient, root: str) -> dict[int, int]:
    return read_forced_assignments(client, root)
