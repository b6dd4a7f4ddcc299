"""Store settings (the server's ``storage.*`` keys) and the store layer's fixed limits."""

from __future__ import annotations

from typing import NamedTuple

from waltz_engine.storage.client import DEFAULT_REQUEST_TIMEOUT_MS

DEFAULT_MAX_BATCH_SIZE = 100  # storage.maxBatchSize
DEFAULT_INITIAL_RETRY_INTERVAL_MS = 100  # storage.initialRetryInterval
DEFAULT_MAX_RETRY_INTERVAL_MS = 20_000  # storage.maxRetryInterval
DEFAULT_CHECKPOINT_INTERVAL = 250_000  # storage.checkpointInterval
# Our extension (storage.lowWaterMark.intervalMs): how often, at most, a replica that took new
# committed records is told its committed prefix (SET_LOW_WATER_MARK in the running session), so
# that its retention cleaner and tier act within a bound of a commit (docs/operations.md adds
# the terms up). 0: only a new store session tells it (the original's behaviour).
DEFAULT_LOW_WATER_MARK_INTERVAL_MS = 20_000

# Fixed in the original: ReplicaSession.CATCH_UP_BATCH_SIZE and RecoveryManagerImpl.MAX_BATCH_SIZE.
CATCH_UP_BATCH_SIZE = 20
RECOVERY_BATCH_SIZE = 20
# StoreSessionManager's backoff on a lost compare-and-set of the partition metadata.
METADATA_INITIAL_RETRY_INTERVAL_MS = 100
METADATA_MAX_RETRY_INTERVAL_MS = 1_000
# The append queue of a session holds at most this many batches (ArrayBlockingQueue(2 x batch)).
QUEUE_CAPACITY_BATCHES = 2
# How long `Store.check_connectivity` waits for one storage node's OPEN.
CONNECTIVITY_CHECK_TIMEOUT_MS = 5_000


class StoreConfig(NamedTuple):
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    initial_retry_interval_ms: int = DEFAULT_INITIAL_RETRY_INTERVAL_MS
    max_retry_interval_ms: int = DEFAULT_MAX_RETRY_INTERVAL_MS
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    # Our addition: how long one storage request may take before the replica gives up on it.
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    low_water_mark_interval_ms: int = DEFAULT_LOW_WATER_MARK_INTERVAL_MS

    def check(self) -> StoreConfig:
        assert self.max_batch_size > 0, "storage.maxBatchSize must be positive"
        assert 0 < self.initial_retry_interval_ms <= self.max_retry_interval_ms, "bad storage retry intervals"
        assert self.checkpoint_interval > 0, "storage.checkpointInterval must be positive"
        assert self.request_timeout_ms > 0
        assert self.low_water_mark_interval_ms >= 0, "storage.lowWaterMark.intervalMs must not be negative"
        return self
