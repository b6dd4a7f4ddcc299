"""FAILURE_RESPONSE bodies as the original writes them: ``StorageRpcException(cause)`` carries
``cause.toString()``, i.e. the Java class name, ": ", and the message (reference §1.2); the
frame that carries one, and a disk error in one line."""

from __future__ import annotations

import errno
from typing import Any

from waltz_engine.common.errors import StorageError
from waltz_engine.storage.control_file import ConcurrentUpdateError
from waltz_engine.wire.primitives import StorageRpcException
from waltz_engine.wire.storage_messages import STORAGE_CODEC, StorageFailureResponse

JAVA_STORAGE_EXCEPTION = "com.wepay.waltz.storage.exception.StorageException"
JAVA_CONCURRENT_UPDATE_EXCEPTION = "com.wepay.waltz.storage.exception.ConcurrentUpdateException"
JAVA_IO_EXCEPTION = "java.io.IOException"
JAVA_EXCEPTION = "java.lang.Exception"


class PartitionNotAssignedError(StorageError):
    """The partition is not open on this node (the original throws a plain ``Exception``)."""

    def __init__(self, partition_id: int) -> None:
        super().__init__(f"Partition:{partition_id} is not assigned.")


class NotAuthorizedError(StorageError):
    """The node's ACLs refuse the request (issue 34); nothing of it was done."""

    def __init__(self, principal: str | None, operation: str, resource: str, request: str) -> None:
        super().__init__(
            f"not authorized: principal {principal or '<none>'} may not {operation} on {resource} "
            f"({request}); ask the cluster's operator for a grant (waltz acl grant)"
        )


class NotOpenedError(StorageError):
    """A request came before a successful OPEN_REQUEST on this connection."""


def java_class_of(error: BaseException) -> str:
    if isinstance(error, ConcurrentUpdateError):
        return JAVA_CONCURRENT_UPDATE_EXCEPTION
    if isinstance(error, PartitionNotAssignedError):
        return JAVA_EXCEPTION
    if isinstance(error, StorageError):
        return JAVA_STORAGE_EXCEPTION
    if isinstance(error, OSError):
        return JAVA_IO_EXCEPTION
    return JAVA_EXCEPTION


def rpc_exception(error: BaseException) -> StorageRpcException:
    """What a client reads as the failure message. No stack frames: ours mean nothing to Java."""
    text = str(error) if not isinstance(error, OSError) else (error.strerror or str(error))
    return StorageRpcException(f"{java_class_of(error)}: {text}", ())


def describe_os_error(error: OSError) -> str:
    """``No space left on device (ENOSPC) in FILE``: what an operator acts on, in one line."""
    code = errno.errorcode.get(error.errno or 0, "")
    text = error.strerror or str(error)
    where = f" in {error.filename}" if error.filename else ""
    return f"{text} ({code}){where}" if code else f"{text}{where}"


def failure_frame(msg: Any, error: BaseException) -> bytes:
    """FAILURE_RESPONSE echoing the request's session id, seq num and partition id."""
    response = StorageFailureResponse(msg.session_id, msg.seq_num, msg.partition_id, rpc_exception(error))
    return STORAGE_CODEC.encode_frame(response)
