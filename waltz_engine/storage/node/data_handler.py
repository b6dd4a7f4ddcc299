"""The data port (``storage.port``): OPEN, then requests routed to their partition's worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from waltz_engine.auth.acl import ADMIN
from waltz_engine.auth.authorizer import Authorizer, resource_name
from waltz_engine.common.errors import ProtocolError, StorageError
from waltz_engine.net.channel import FramedConnection
from waltz_engine.storage.node.failures import NotAuthorizedError, NotOpenedError, PartitionNotAssignedError
from waltz_engine.storage.node.partition_worker import PARTITION_REQUEST_TYPES, PartitionWorker, failure_frame
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.wire.storage_messages import (
    NO_PARTITION_ID,
    NO_SEQ_NUM,
    NO_SESSION_ID,
    STORAGE_CODEC,
    StorageOpenRequest,
    StorageSuccessResponse,
    request_name,
)

log = logging.getLogger(__name__)
DATA_PORT = "storage data port"

NOT_OPENED_MESSAGE = "the connection is not open: the first request must be OPEN_REQUEST"
_OPEN_SUCCESS_FRAME = STORAGE_CODEC.encode_frame(
    StorageSuccessResponse(NO_SESSION_ID, NO_SEQ_NUM, NO_PARTITION_ID)
)


async def check_open(manager: StorageManager, key: Any, num_partitions: int) -> StorageError | None:
    """Validate an OPEN off the event loop (the manager's lock may be held by an admin change)."""
    try:
        await asyncio.get_running_loop().run_in_executor(None, manager.open, key, num_partitions)
    except StorageError as e:
        return e
    return None


class DataHandler:
    """``handler(conn)`` for :func:`waltz_engine.net.channel.serve` on the data port."""

    def __init__(
        self,
        manager: StorageManager,
        worker_of: Callable[[int], PartitionWorker | None],
        authorizer: Authorizer | None = None,
    ) -> None:
        self._manager = manager
        self._worker_of = worker_of
        self._authorizer = authorizer

    async def __call__(self, conn: FramedConnection) -> None:
        """Requests are cut and queued for their partition's disk pass in the connection's read
        callback when nothing needs waiting (no task turn); OPEN, a session check, a full queue
        and everything after them go to this task in order, reading paused meanwhile."""
        opened = False
        authorizer = self._authorizer
        principal = authorizer.principal_of(conn, DATA_PORT) if authorizer is not None else None

        def refused(msg: Any) -> bool:
            """Every request of the data port is the servers' and the operator's tools' (admin):
            one the ACLs refuse is answered with a failure here."""
            if authorizer is None:
                return False
            name = request_name(msg)
            if authorizer.check(principal, ADMIN, msg.partition_id, name, conn.peer):
                return False
            resource = resource_name(msg.partition_id)
            conn.send_frame(failure_frame(msg, NotAuthorizedError(principal, ADMIN, resource, name)))
            return True

        def now(msg: Any) -> bool:
            if not opened or type(msg) not in PARTITION_REQUEST_TYPES:
                return False
            if refused(msg):
                return True
            worker = self._worker_of(msg.partition_id)
            if worker is None:
                conn.send_frame(failure_frame(msg, PartitionNotAssignedError(msg.partition_id)))
                return True
            return worker.submit_now(conn, msg)

        async def later(msg: Any) -> None:
            nonlocal opened
            kind = type(msg)
            if kind is StorageOpenRequest:
                error = await check_open(self._manager, msg.key, msg.num_partitions)
                if error is None:
                    opened = True
                    conn.send_frame(_OPEN_SUCCESS_FRAME)
                else:
                    # As the original, the connection stays; a client closes after a failed OPEN.
                    log.warning("data port: OPEN from %s refused: %s", conn.peer, error)
                    conn.send_frame(failure_frame(msg, error))
                return
            if kind not in PARTITION_REQUEST_TYPES:
                raise ProtocolError(f"{kind.__name__} is not a request the storage data port serves")
            if not opened:
                conn.send_frame(failure_frame(msg, NotOpenedError(NOT_OPENED_MESSAGE)))
                await conn.drain()
                raise ProtocolError(f"{request_name(msg)} before a successful OPEN_REQUEST")
            if refused(msg):
                return
            worker = self._worker_of(msg.partition_id)
            if worker is None:
                conn.send_frame(failure_frame(msg, PartitionNotAssignedError(msg.partition_id)))
            else:
                await worker.submit(conn, msg)

        await conn.handle(now, later)

