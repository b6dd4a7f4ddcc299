"""Filling a replica whose missing records were removed by retention on every other replica.

A replica added (or whose disk was replaced) after retention removed a partition's head cannot
get the records below the retained start from anyone. It can still hold everything that is
left: its log then begins at the retained start. The storage node allows that only for a
partition that never held a record, and only up to its effective retention bound (see
``PartitionWorker._start_late``), so a replica holding some old records is emptied first —
they are below the retained start, i.e. records the operator allowed to go. A replica whose own
head was removed too (it fell behind while down) is emptied as well: our storage nodes take a
truncate to -1 of a log whose local head is gone as "begin again at 0" (``Partition.truncate``);
a Java node has no retention, so never such a log.
"""

from __future__ import annotations

import logging

from waltz_engine.server.store.errors import RecoveryFailedError, RetainedStartError
from waltz_engine.server.store.replica_connection import ReplicaConnection
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk.payloads import ReplicaId
from waltz_engine.zk.retention import retained_start_in

log = logging.getLogger(__name__)


def retained_start_error(error: StorageRpcError) -> RetainedStartError | None:
    """The storage FAILURE ``error`` as a :class:`RetainedStartError`, if that is what it says."""
    start = retained_start_in(str(error))
    return None if start is None else RetainedStartError(str(error), start)


async def restart_at_retained_start(
    connection: ReplicaConnection, replica_id: ReplicaId, max_transaction_id: int, retained_start: int
) -> int:
    """Prepare a replica holding up to ``max_transaction_id`` to continue at ``retained_start``;
    returns the max txid to continue after (``retained_start - 1``)."""
    if max_transaction_id + 1 >= retained_start:
        raise RecoveryFailedError(
            f"{replica_id}: needs transaction {max_transaction_id + 1}, which is not below the retained "
            f"start {retained_start}"
        )
    if max_transaction_id >= 0:
        log.warning(
            "%s: holds transactions up to %d only, below the retained start %d elsewhere: emptying it",
            replica_id,
            max_transaction_id,
            retained_start,
        )
        await connection.truncate(-1)
    log.info("%s: filling from the retained start %d", replica_id, retained_start)
    return retained_start - 1
