"""What a client call can fail with (the original's ``com.wepay.waltz.exception`` classes, §3.1).

Every error derives from :class:`WaltzClientError` (a :class:`WaltzError`), so an application
needs one ``except`` for everything the client reports.
"""

from __future__ import annotations

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.reqid import ReqId


class WaltzClientError(WaltzError):
    """Base of the client's errors (the original's ``WaltzClientRuntimeException``)."""


class ClientClosedError(WaltzClientError):
    """The client was closed before the call could send anything (an append sent before the
    close that no server decided ends with :class:`OutcomeUnknownError` instead)."""

    def __init__(self, message: str = "the Waltz client is closed") -> None:
        super().__init__(message)


class ClientTimeoutError(WaltzClientError):
    """A bounded wait (mount, registration, flush, RPC) ran out: no usable server answered."""


class ClientAheadError(WaltzClientError):
    """The application's stored high-water mark is beyond what the server has (MOUNT → CLIENT_AHEAD)."""


class DataChecksumError(WaltzClientError):
    """Transaction data kept failing its CRC-32 check after every allowed attempt."""


class InvalidOperationError(WaltzClientError):
    """The call is not allowed in this configuration (e.g. set_partitions with client.autoMount on)."""


class PartitionInactiveError(WaltzClientError):
    """The partition is not one this client works with (see set_partitions)."""

    def __init__(self, partition_id: int) -> None:
        super().__init__(f"partition {partition_id} is not active in this client")
        self.partition_id = partition_id


class PartitionNotFoundError(WaltzClientError):
    """A partition id outside ``0 .. num_partitions - 1``."""


class RpcError(WaltzClientError):
    """A server answered an RPC with an error message."""


class ClientTlsRefusedError(WaltzClientError):
    """The server ended the TLS handshake: it refused this client's certificate, or wanted one."""


class PartitionStoppedError(WaltzClientError):
    """The client stopped working with a partition: ``apply_transaction`` kept raising on one
    transaction (see ``MAX_APPLICATION_ATTEMPTS``). The original exception is the cause."""

    def __init__(self, partition_id: int, transaction_id: int, attempts: int, cause: BaseException) -> None:
        super().__init__(
            f"partition {partition_id} stopped: apply_transaction raised on transaction {transaction_id} "
            f"{attempts} times in a row (last: {type(cause).__name__}: {cause}); this client no longer "
            "reads or writes the partition"
        )
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.attempts = attempts
        self.__cause__ = cause


class OutcomeUnknownError(WaltzClientError):
    """The client closed or gave up while an attempt could still commit: it may be in the log or not.

    Only the feed can tell: an application that stores its high-water mark with its effects sees
    the transaction applied (``apply_transaction``) if, and only if, it committed. Never retried.
    """

    def __init__(self, req_id: ReqId, reason: str) -> None:
        super().__init__(
            f"outcome unknown of append {req_id} on partition {req_id.partition_id}: {reason}; "
            "it may have committed (the feed will show it if it did)"
        )
        self.req_id = req_id
        self.partition_id = req_id.partition_id


class AuthorizationError(WaltzClientError):
    """The server's ACLs refused a request of this client (issue 34): ``principal`` may not
    ``operation`` on ``partition_id`` (-1: a request about no one partition).

    Nothing of the refused request was done: a refused append is certainly not committed (it is
    never retried), a refused mount or feed delivers nothing more. Ask the cluster's operator for
    a grant (``waltz acl grant``); the refusal is in the server's audit log.
    """

    def __init__(self, operation: str, partition_id: int, principal: str | None, request: str) -> None:
        where = f"partition {partition_id}" if partition_id >= 0 else "the cluster"
        super().__init__(
            f"not authorized: principal {principal or '<none>'} may not {operation} on {where} "
            f"({request} refused by the server's ACLs; nothing of it was done)"
        )
        self.operation = operation
        self.partition_id = partition_id
        self.principal = principal
        self.request = request
