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

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
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
        starts_late,
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

_EXPORTS = {
    "DEFAULT_RECOVERY_BATCH_SIZE": "layout",
    "DEFAULT_TIMEOUT_MS": "layout",
    "GAUGE_PARTITION_IDS": "layout",
    "MAX_RECOVERY_BATCH_SIZE": "layout",
    "NO_TRANSACTION": "layout",
    "RECOVERY_LOG_INTERVAL_TXNS": "layout",
    "RECOVERY_MAX_ATTEMPTS": "layout",
    "RECOVERY_RETRY_BACKOFF_MS": "layout",
    "SSL_CONFIG_PREFIX": "layout",
    "STORAGE_ADDRESS_FORM": "layout",
    "StorageAdminError": "layout",
    "StorageContext": "layout",
    "StorageNode": "layout",
    "StoreLayout": "layout",
    "check_partitions": "layout",
    "client_ssl_context": "layout",
    "client_tls_config": "layout",
    "parse_admin_address": "layout",
    "parse_storage_address": "layout",
    "read_store_layout": "layout",
    "SESSION_CHANGE_ATTEMPTS": "operations",
    "EndpointCheck": "operations",
    "NodePartitions": "operations",
    "PartitionStatus": "operations",
    "SyncResult": "operations",
    "add_partitions": "operations",
    "admin_client": "operations",
    "data_client": "operations",
    "list_all_partitions": "operations",
    "list_partitions": "operations",
    "max_transaction_id": "operations",
    "partition_status_from_metrics": "operations",
    "plan_sync": "operations",
    "remove_partitions": "operations",
    "set_availability": "operations",
    "starts_late": "operations",
    "sync_partitions": "operations",
    "validate": "operations",
    "RecoveryProgress": "recovery",
    "RecoveryResult": "recovery",
    "check_batch_size": "recovery",
    "recover_partition": "recovery",
    "replica_checksums": "recovery",
}

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
    "starts_late",
    "sync_partitions",
    "validate",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
