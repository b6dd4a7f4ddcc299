"""Cluster operations: the original's ``ClusterCli`` and ``ServerCli`` as a library (reference §4.3, §4.5),
plus what the original lacked: forced server assignment (its issue #6), starting a store
session from a tool (``recover_partition``) and an offline tail cut (``truncate_partition``).

Every function returns plain data and raises :class:`ClusterOpsError` (one line) for bad
input or an operation that cannot be done; the CLI is a thin skin over them. ZooKeeper reads
are blocking (kazoo) and happen before any network call, as one :class:`ClusterView`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.ops.cluster_ops.repair import (
        DEFAULT_RECOVER_TIMEOUT_S,
        REPLICA_POLL_INTERVAL_S,
        RecoverResult,
        TruncateResult,
        recover_partition,
        truncate_partition,
    )
    from waltz_engine.ops.cluster_ops.servers import (
        ForcedAssignment,
        ServerPartitionList,
        add_preferred_partitions,
        assign_partition,
        forced_assignments,
        live_server,
        remove_preferred_partitions,
        server_endpoint,
        server_list,
        unassign_partition,
    )
    from waltz_engine.ops.cluster_ops.verify import (
        CANNOT_OBTAIN_REPLICA_STATES,
        NO_SERVER_ENDPOINT,
        PartitionValidation,
        ValidationResult,
        ValidationType,
        VerifyReport,
        check_verify_partition,
        verify,
    )
    from waltz_engine.ops.cluster_ops.view import (
        DEFAULT_TIMEOUT_MS,
        DEFAULT_VERIFY_TIMEOUT_S,
        GAUGE_NUM_PARTITIONS,
        GAUGE_REPLICA_INFO,
        LINE_SEPARATOR,
        METRICS_PATH,
        NO_SERVER,
        NO_TRANSACTION,
        TOOLS_SSL_PREFIX,
        ClusterOpsError,
        ClusterView,
        ServerConnectivity,
        check_connectivity,
        java_bool_map,
        java_list,
        read_cluster_view,
        tools_ssl_context,
        tools_tls_config,
    )

_EXPORTS = {
    "DEFAULT_RECOVER_TIMEOUT_S": "repair",
    "REPLICA_POLL_INTERVAL_S": "repair",
    "RecoverResult": "repair",
    "TruncateResult": "repair",
    "recover_partition": "repair",
    "truncate_partition": "repair",
    "ForcedAssignment": "servers",
    "ServerPartitionList": "servers",
    "add_preferred_partitions": "servers",
    "assign_partition": "servers",
    "forced_assignments": "servers",
    "live_server": "servers",
    "remove_preferred_partitions": "servers",
    "server_endpoint": "servers",
    "server_list": "servers",
    "unassign_partition": "servers",
    "CANNOT_OBTAIN_REPLICA_STATES": "verify",
    "NO_SERVER_ENDPOINT": "verify",
    "PartitionValidation": "verify",
    "ValidationResult": "verify",
    "ValidationType": "verify",
    "VerifyReport": "verify",
    "check_verify_partition": "verify",
    "verify": "verify",
    "DEFAULT_TIMEOUT_MS": "view",
    "DEFAULT_VERIFY_TIMEOUT_S": "view",
    "GAUGE_NUM_PARTITIONS": "view",
    "GAUGE_REPLICA_INFO": "view",
    "LINE_SEPARATOR": "view",
    "METRICS_PATH": "view",
    "NO_SERVER": "view",
    "NO_TRANSACTION": "view",
    "TOOLS_SSL_PREFIX": "view",
    "ClusterOpsError": "view",
    "ClusterView": "view",
    "ServerConnectivity": "view",
    "check_connectivity": "view",
    "java_bool_map": "view",
    "java_list": "view",
    "read_cluster_view": "view",
    "tools_ssl_context": "view",
    "tools_tls_config": "view",
}

__all__ = [
    "CANNOT_OBTAIN_REPLICA_STATES",
    "ClusterOpsError",
    "ClusterView",
    "DEFAULT_RECOVER_TIMEOUT_S",
    "DEFAULT_TIMEOUT_MS",
    "DEFAULT_VERIFY_TIMEOUT_S",
    "ForcedAssignment",
    "GAUGE_NUM_PARTITIONS",
    "GAUGE_REPLICA_INFO",
    "LINE_SEPARATOR",
    "METRICS_PATH",
    "NO_SERVER",
    "NO_SERVER_ENDPOINT",
    "NO_TRANSACTION",
    "PartitionValidation",
    "REPLICA_POLL_INTERVAL_S",
    "RecoverResult",
    "ServerConnectivity",
    "ServerPartitionList",
    "TOOLS_SSL_PREFIX",
    "TruncateResult",
    "ValidationResult",
    "ValidationType",
    "VerifyReport",
    "add_preferred_partitions",
    "assign_partition",
    "check_connectivity",
    "check_verify_partition",
    "forced_assignments",
    "java_bool_map",
    "java_list",
    "live_server",
    "read_cluster_view",
    "recover_partition",
    "remove_preferred_partitions",
    "server_endpoint",
    "server_list",
    "tools_ssl_context",
    "tools_tls_config",
    "truncate_partition",
    "unassign_partition",
    "verify",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)

# A name that is also a submodule's is bound now: importing the submodule `verify` would
# otherwise leave the package attribute pointing at the module, not at the function.
from waltz_engine.ops.cluster_ops.verify import verify  # noqa: E402
