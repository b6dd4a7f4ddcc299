"""The data port (``storage.port``): OPEN, then requests routed to their partition's worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from waltz_engine.auth.acl import ADMIN
from waltz_engine.auth.authorizer import Authorizer, resource_name
from waltz_engine.common.errors import ProtocolError, StorageError
from waltz_engine.net.channel import FramedConnection, HandBack
from waltz_engine.storage.node.connection_threads import ConnectionThreads
from waltz_engine.storage.node.failures import (
    NotAuthorizedError,
    NotOpenedError,
    PartitionNotAssignedError,
    failure_frame,
)
from waltz_engine.storage.node.partition_worker import PARTITION_REQUEST_TYPES, PartitionWorker
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
        threads: ConnectionThreads | None = None,
    ) -> None:
        self._manager = manager
        self._worker_of = worker_of
        self._authorizer = authorizer
        self._threads = threads

    async def __call__(self, conn: FramedConnection) -> None:
        """Requests are cut and queued for their partition's disk pass in the connection's read
        callback when nothing needs waiting (no task turn); OPEN, a session check, a full queue
        and everything after them go to this task in order, reading paused meanwhile. Once OPEN
        succeeded, a thread of the connection's own may read it instead (connection_threads.py)."""
        opened = False
        on_thread = False  # a thread read the connection (once: it stays on the loop after)
        authorizer = self._authorizer
        principal = authorizer.principal_of(conn, DATA_PORT) if authorizer is not None else None

        def refusal(msg: Any, worker: PartitionWorker | None) -> bytes | None:
            """The failure that answers a partition's request at once (on the loop or the
            connection's thread), None to serve it. Every request of the data port is the
            servers' and the operator's tools' (admin); a request the ACLs refuse, or for a
            partition not assigned here, is refused."""
            if authorizer is not None:
                name = request_name(msg)
                if not authorizer.check(principal, ADMIN, msg.partition_id, name, conn.peer):
                    resource = resource_name(msg.partition_id)
                    return failure_frame(msg, NotAuthorizedError(principal, ADMIN, resource, name))
            if worker is None:
                return failure_frame(msg, PartitionNotAssignedError(msg.partition_id))
            return None

        def now(msg: Any) -> bool:
            if not opened or type(msg) not in PARTITION_REQUEST_TYPES:
                return False
            worker = self._worker_of(msg.partition_id)
            refused = refusal(msg, worker)
            if refused is not None:
                conn.send_frame(refused)
                return True
            assert worker is not None
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
            worker = self._worker_of(msg.partition_id)
            refused = refusal(msg, worker)
            if refused is not None:
                conn.send_frame(refused)
            else:
                assert worker is not None
                await worker.submit(conn, msg)

        async def take_over() -> HandBack | None:
            """A thread reads the connection from here, when OPEN succeeded and one is free."""
            nonlocal on_thread
            threads = self._threads
            assert threads is not None
            if not opened or on_thread:
                return None
            thread = threads.start(conn, self._worker_of, refusal, later, authorizer is not None)
            if thread is None:
                return None
            on_thread = True
            try:
                return await thread.done
            except BaseException:
                thread.stopping = True  # (the node stops: the connection is closed next)
                raise

        await conn.handle(now, later, take_over=take_over if self._threads is not None else None)
