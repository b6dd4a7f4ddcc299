"""The Waltz client: asyncio-native :class:`WaltzClient`, blocking :class:`SyncWaltzClient`, mock driver.

See the original's WaltzClient API (reference §3.1): an application subclasses
:class:`TransactionContext`, implements :class:`WaltzClientCallbacks` and submits contexts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from waltz_engine.client.callbacks import WaltzClientCallbacks
    from waltz_engine.client.client import WaltzClient
    from waltz_engine.client.config import WaltzClientConfig
    from waltz_engine.client.errors import (
        AuthorizationError,
        ClientAheadError,
        ClientClosedError,
        ClientTimeoutError,
        ClientTlsRefusedError,
        DataChecksumError,
        InvalidOperationError,
        OutcomeUnknownError,
        PartitionInactiveError,
        PartitionNotFoundError,
        PartitionStoppedError,
        RpcError,
        WaltzClientError,
    )
    from waltz_engine.client.mock_driver import MockDriver, MockServerPartition
    from waltz_engine.client.sync_client import SyncWaltzClient
    from waltz_engine.client.transaction import Transaction
    from waltz_engine.client.transaction_builder import PartitionLocalLock, Serializer, TransactionBuilder
    from waltz_engine.client.transaction_context import TransactionContext

_EXPORTS = {
    "WaltzClientCallbacks": "callbacks",
    "WaltzClient": "client",
    "WaltzClientConfig": "config",
    "AuthorizationError": "errors",
    "ClientAheadError": "errors",
    "ClientClosedError": "errors",
    "ClientTimeoutError": "errors",
    "ClientTlsRefusedError": "errors",
    "DataChecksumError": "errors",
    "InvalidOperationError": "errors",
    "OutcomeUnknownError": "errors",
    "PartitionInactiveError": "errors",
    "PartitionNotFoundError": "errors",
    "PartitionStoppedError": "errors",
    "RpcError": "errors",
    "WaltzClientError": "errors",
    "MockDriver": "mock_driver",
    "MockServerPartition": "mock_driver",
    "SyncWaltzClient": "sync_client",
    "Transaction": "transaction",
    "PartitionLocalLock": "transaction_builder",
    "Serializer": "transaction_builder",
    "TransactionBuilder": "transaction_builder",
    "TransactionContext": "transaction_context",
}

__all__ = [
    "AuthorizationError",
    "ClientAheadError",
    "ClientClosedError",
    "ClientTimeoutError",
    "ClientTlsRefusedError",
    "DataChecksumError",
    "InvalidOperationError",
    "MockDriver",
    "MockServerPartition",
    "OutcomeUnknownError",
    "PartitionInactiveError",
    "PartitionLocalLock",
    "PartitionNotFoundError",
    "PartitionStoppedError",
    "RpcError",
    "Serializer",
    "SyncWaltzClient",
    "Transaction",
    "TransactionBuilder",
    "TransactionContext",
    "WaltzClient",
    "WaltzClientCallbacks",
    "WaltzClientConfig",
    "WaltzClientError",
]

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
