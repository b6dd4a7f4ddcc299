"""A committed transaction as the feed delivers it; its data is fetched only when asked for."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, TypeVar, overload

from waltz_engine.client.errors import InvalidOperationError
from waltz_engine.client.loop_thread import call_on_loop
from waltz_engine.common.reqid import ReqId

if TYPE_CHECKING:
    from waltz_engine.client.rpc_client import RpcClient
    from waltz_engine.client.transaction_builder import Serializer

T = TypeVar("T")


class Transaction:
    __slots__ = ("transaction_id", "header", "req_id", "_rpc", "_loop", "_loop_thread")

    def __init__(
        self,
        transaction_id: int,
        header: int,
        req_id: ReqId,
        rpc: RpcClient,
        loop: asyncio.AbstractEventLoop,
        loop_thread: threading.Thread,
    ) -> None:
        self.transaction_id = transaction_id
        self.header = header
        self.req_id = req_id
        self._rpc = rpc
        self._loop = loop
        self._loop_thread = loop_thread

    @property
    def partition_id(self) -> int:
        return self.req_id.partition_id

    def __repr__(self) -> str:
        return f"Transaction(id={self.transaction_id}, header={self.header}, {self.req_id})"

    @overload
    async def data(self) -> bytes: ...

    @overload
    async def data(self, serializer: Serializer[T]) -> T: ...

    async def data(self, serializer: Serializer[T] | None = None) -> bytes | T:
        """The transaction's data from the server (CRC-checked; DataChecksumError after 5 bad copies)."""
        raw = await self._rpc.get_transaction_data(self.req_id.partition_id, self.transaction_id)
        return raw if serializer is None else serializer.deserialize(raw)

    @overload
    def get_data(self) -> bytes: ...

    @overload
    def get_data(self, serializer: Serializer[T]) -> T: ...

    def get_data(self, serializer: Serializer[T] | None = None) -> bytes | T:
        """Blocking :meth:`data` for callbacks running on consumer threads (SyncWaltzClient)."""
        if threading.current_thread() is self._loop_thread:
            raise InvalidOperationError(
                "get_data() would block the client's event loop; use 'await transaction.data()' "
                "in callbacks that run on the loop"
            )
        if serializer is None:
            return call_on_loop(self.data(), self._loop, self._loop_thread)
        return call_on_loop(self.data(serializer), self._loop, self._loop_thread)
