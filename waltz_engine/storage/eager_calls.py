"""The pending calls of a storage connection answered in its read callback, not through a
future whose waiter would run a loop turn later (the server's lone commit: three per commit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from waltz_engine.wire.storage_messages import NO_PARTITION_ID, NO_SESSION_ID, StorageSuccessResponse

if TYPE_CHECKING:
    from waltz_engine.storage.client import StorageClient

OPEN_SEQ_NUM = -1
# What an eager call is answered with when its SUCCESS was recognised by its bytes.
RECOGNISED_SUCCESS = StorageSuccessResponse(NO_SESSION_ID, OPEN_SEQ_NUM, NO_PARTITION_ID)


class EagerCall:
    """A pending call answered by a callback in the connection's read callback, not a future
    (whose waiter would run a loop turn later): ``answered(response, error)``, once."""

    __slots__ = ("_answered", "_done")

    def __init__(self, answered: Callable[[Any, BaseException | None], None]) -> None:
        self._answered = answered
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, response: Any) -> None:
        self._done = True
        self._answered(response, None)

    def succeeded(self) -> None:
        """A SUCCESS recognised by its bytes (``StorageClient._on_bytes``): no response to check."""
        self._done = True
        self._answered(RECOGNISED_SUCCESS, None)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        self._answered(None, error)


class AppendCall:
    """An APPEND sent by :meth:`StorageClient.send_append_call`, answered in its answer's read
    callback (or at the connection's end, or its deadline) by :meth:`on_success` or
    :meth:`on_failure`, once: a subclass brings them, so the answer reaches its caller with no
    future and no closure between (the server's lone commit: three per commit)."""

    __slots__ = ("_done", "_client", "seq_num")

    # Set by ``send_append_call``. Its answer takes it off the client's current table (a
    # connection's end fails the calls of a table it already replaced).
    _client: StorageClient

    def __init__(self) -> None:
        self._done = False
        self.seq_num = OPEN_SEQ_NUM

    def on_success(self) -> None:
        raise NotImplementedError

    def on_failure(self, error: BaseException) -> None:
        raise NotImplementedError

    def done(self) -> bool:
        return self._done

    def succeeded(self) -> None:
        """A SUCCESS recognised by its bytes (``StorageClient._on_bytes``)."""
        self._done = True
        self._client._pending.pop(self.seq_num, None)
        self.on_success()

    def set_result(self, response: Any) -> None:
        self._done = True
        client = self._client
        client._pending.pop(self.seq_num, None)
        error = client._append_error(response)
        if error is None:
            self.on_success()
        else:
            self.on_failure(error)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        self._client._pending.pop(self.seq_num, None)
        self.on_failure(error)


# The calls answered in the read callback, not through a future.
EAGER_CALLS = (EagerCall, AppendCall)
