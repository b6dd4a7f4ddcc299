"""Storage node administration: the original's ``StorageCli`` operations as a library (reference §4.2).

Every operation opens its own bounded connections (OPEN with the cluster key and partition
count from ZooKeeper's StoreParams), does its work and closes them, and returns plain data.
A node answering FAILURE, a node that cannot be reached, and bad input all raise
:class:`StorageAdminError` with one line naming the node and, where there is one, the node's
own message. The CLI (``waltz storage ...``) is a thin skin over these functions.

``recover_partition`` is the original's ``StorageRecoveryRunnable``; ``replica_checksums`` is
its ``WaltzStorage.checksums`` (CRC-32 over every segment's bytes after the 128-byte header),
computed on a directory whose node is stopped.
"""

from waltz_engine.storage.admin_ops.layout import (
    DEFAULT_RECOVERY_BATCH_SIZE,
    DEFAULT_TIMEOUT_MS,
    GAUGE_PARTITION_IDS,
    MAX_RECOVERY_BATCH_SIZE,
    NO_TRANSACTION,
    RECOVERY_LOG_INTERVAL_TXNS,
    RECOVERY_MAX_ATTEMPTS,
    RECOVERY_RETRY_BACKOFF_MS,
    SSL_CONFIG_PREFIX,
    STORAGE_ADDRESS_FORM,
    StorageAdminError,
    StorageContext,
    StorageNode,
    StoreLayout,
    check_partitions,
    client_ssl_context,
    client_tls_config,
    parse_admin_address,
    parse_storage_address,
    read_store_layout,
)
from waltz_engine.storage.admin_ops.operations import (
    SESSION_CHANGE_ATTEMPTS,
    EndpointCheck,
    NodePartitions,
    PartitionStatus,
    SyncResult,
    add_partitions,
    admin_client,
    data_client,
    list_all_partitions,
    list_partitions,
    max_transaction_id,
    partition_status_from_metrics,
    plan_sync,
    remove_partitions,
    set_availability,
    sync_partitions,
    validate,
)
from waltz_engine.storage.admin_ops.recovery import (
    RecoveryProgress,
    RecoveryResult,
    check_batch_size,
    recover_partition,
    replica_checksums,
)

__all__ = [
    "SESSION_CHANGE_ATTEMPTS",
    "DEFAULT_RECOVERY_BATCH_SIZE",
    "DEFAULT_TIMEOUT_MS",
    "EndpointCheck",
    "GAUGE_PARTITION_IDS",
    "MAX_RECOVERY_BATCH_SIZE",
    "NO_TRANSACTION",
    "NodePartitions",
    "PartitionStatus",
    "RECOVERY_LOG_INTERVAL_TXNS",
    "RECOVERY_MAX_ATTEMPTS",
    "RECOVERY_RETRY_BACKOFF_MS",
    "RecoveryProgress",
    "RecoveryResult",
    "SSL_CONFIG_PREFIX",
    "STORAGE_ADDRESS_FORM",
    "StorageAdminError",
    "StorageContext",
    "StorageNode",
    "StoreLayout",
    "SyncResult",
    "add_partitions",
    "admin_client",
    "check_batch_size",
    "check_partitions",
    "client_ssl_context",
    "client_tls_config",
    "data_client",
    "list_all_partitions",
    "list_partitions",
    "max_transaction_id",
    "parse_admin_address",
    "parse_storage_address",
    "partition_status_from_metrics",
    "plan_sync",
    "read_store_layout",
    "recover_partition",
    "remove_partitions",
    "replica_checksums",
    "set_availability",
    "sync_partitions",
    "validate",
]
