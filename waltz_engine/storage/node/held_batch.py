"""A partition's lone APPEND in a disk pass that syncs its partitions together (one ``syncfs``).

The pass (disk_passes.py) runs each partition's batch on its own thread; a batch of one APPEND of
the session at the next txid is written with its sync left to the pass
(waltz_engine/storage/held_append.py), the partition held meanwhile. Its SUCCESS, the worker's
cached span and the append metrics wait for the pass's sync: if that fails, the answer becomes
the FAILURE the same error would give from the partition's own ``fdatasync``, and the cached span
is the partition's after the cut. Anything else takes the worker's usual path (its own syncs).
A part of :class:`PartitionWorker` kept apart for size: it uses the worker's own members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.common.clock import monotonic_s
from waltz_engine.disk.partition_info import FLAG_ASSIGNED, FLAG_AVAILABLE
from waltz_engine.net.channel import FramedConnection
from waltz_engine.storage.held_append import PassSyncs, Span
from waltz_engine.storage.node.disk_passes import Reply
from waltz_engine.storage.node.failures import failure_frame
from waltz_engine.storage.partition import Partition
from waltz_engine.wire.storage_messages import StorageAppendRunRequest, success_frame

if TYPE_CHECKING:
    from waltz_engine.storage.node.partition_worker import PartitionWorker

# A replica that serves normal requests: both flags set (``PartitionWorker._check_permissions``).
ONLINE_FLAGS = FLAG_ASSIGNED | FLAG_AVAILABLE


def lone_append_partition(worker: PartitionWorker, msg: StorageAppendRunRequest) -> Partition | None:
    """The partition of an APPEND of the session on an online replica (a few comparisons)."""
    return online_partition(worker, msg.session_id, msg.used_by_offline_recovery)


def online_partition(worker: PartitionWorker, session_id: int, offline: bool) -> Partition | None:
    """:func:`lone_append_partition` of an APPEND's fields (a data connection's thread reads them
    from the frame's bytes: connection_threads.py)."""
    partition = worker.partition
    if partition is None or offline or session_id != worker.session_id:
        return None
    return partition if partition.info.current.flags & ONLINE_FLAGS == ONLINE_FLAGS else None


def append_held(
    worker: PartitionWorker, conn: FramedConnection, msg: StorageAppendRunRequest, syncs: PassSyncs
) -> list[Reply] | None:
    """The batch's replies (answered once ``syncs`` finished), or None: nothing done, the worker's
    usual path takes the request (not the session's lone append at the next txid, or not within
    the current segment)."""
    partition = lone_append_partition(worker, msg)
    if partition is None:
        return None
    started_s = monotonic_s()
    try:
        held = partition.append_held(msg.records)
    except Exception as e:
        # The write failed (cut back): this partition alone, as with its own sync.
        return [(conn, worker._append_failed(partition, msg, e))]
    if held is None:
        return None
    replies: list[Reply] = [(conn, success_frame(msg.session_id, msg.seq_num, msg.partition_id))]

    def settled(error: OSError | None, span: Span) -> None:
        worker.first_transaction_id, worker.max_transaction_id = span
        if error is not None:
            worker._log_failure(msg, error)
            replies[0] = (conn, failure_frame(msg, error))
            return
        worker.appended(started_s)

    syncs.hold(held, settled)
    return replies
