"""A test application: contexts that record their outcome, callbacks that record what they applied.

Outcomes are ``concurrent.futures`` futures so both asyncio tests (``await ctx.result()``) and
threaded tests (``ctx.future.result(timeout)``) can wait on them, bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterable

from waltz_engine.client import Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_engine.common.reqid import ReqId

WAIT_S = 10.0
POLL_S = 0.005


class StringSerializer:
    def serialize(self, value: str) -> bytes:
        return value.encode()

    def deserialize(self, data: bytes) -> str:
        return data.decode()


STRINGS = StringSerializer()


class MockContext(TransactionContext):
    def __init__(
        self,
        data: str = "transaction",
        *,
        partition: int = 0,
        header: int = 0,
        write_locks: Iterable[int] = (),
        read_locks: Iterable[int] = (),
        append_locks: Iterable[int] = (),
        retry: bool = True,
    ) -> None:
        super().__init__()
        self.data = data
        self.partition = partition
        self.header = header
        self.write_locks = [("test", i) for i in write_locks]
        self.read_locks = [("test", i) for i in read_locks]
        self.append_locks = [("test", i) for i in append_locks]
        self.retry = retry
        self.exec_count = 0
        self.future: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self.application: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self.lock_failure: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self.events: list[str] = []

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        self.exec_count += 1
        if not self.retry and self.exec_count > 1:
            return False
        builder.set_header(self.header)
        builder.set_transaction_data(self.data, STRINGS)
        builder.set_write_locks(self.write_locks)
        builder.set_read_locks(self.read_locks)
        builder.set_append_locks(self.append_locks)
        return True

    def on_completion(self, result: bool) -> None:
        self.events.append(f"completion:{result}")
        if not self.future.done():
            self.future.set_result(result)

    def on_application(self) -> None:
        self.events.append("application")
        if not self.application.done():
            self.application.set_result(True)

    def on_exception(self, exception: BaseException) -> None:
        self.events.append(f"exception:{type(exception).__name__}")
        if not self.future.done():
            self.future.set_exception(exception)

    def on_lock_failure(self) -> None:
        self.events.append("lock_failure")
        if not self.lock_failure.done():
            self.lock_failure.set_result(True)

    async def result(self, timeout_s: float = WAIT_S) -> bool:
        return await asyncio.wait_for(asyncio.wrap_future(self.future), timeout_s)


class MockCallbacks(WaltzClientCallbacks):
    """Applies transactions in order; optionally fetches each one's data (as the original's tests)."""

    def __init__(self, high_water_marks: dict[int, int] | None = None, fetch_data: bool = False) -> None:
        self.high_water_marks = dict(high_water_marks or {})
        self.fetch_data = fetch_data
        self.applied: list[tuple[int, int, int, ReqId]] = []  # partition, txid, header, reqId
        self.data: list[object] = []
        self.uncaught: list[tuple[int, int, BaseException]] = []
        self.fail_next_apply = 0
        self.hwm_seen_by_application: list[int] = []
        self._lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_marks.get(partition_id, -1)

    async def apply_transaction(self, transaction: Transaction) -> None:
        partition_id = transaction.partition_id
        assert transaction.transaction_id == self.get_client_high_water_mark(partition_id) + 1, "out of order"
        if self.fail_next_apply:
            self.fail_next_apply -= 1
            raise RuntimeError("application failure (injected)")
        if self.fetch_data:
            try:
                value: str = await transaction.data(STRINGS)
                self.data.append(value)
            except Exception as e:
                self.data.append(e)
        with self._lock:
            self.applied.append(
                (partition_id, transaction.transaction_id, transaction.header, transaction.req_id)
            )
            self.high_water_marks[partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.uncaught.append((partition_id, transaction_id, exception))

    def req_ids(self, partition_id: int = 0) -> set[ReqId]:
        with self._lock:
            return {r for p, _, _, r in self.applied if p == partition_id}

    async def wait_for_high_water_mark(
        self, partition_id: int, target: int, timeout_s: float = WAIT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while self.get_client_high_water_mark(partition_id) < target:
            assert time.monotonic() < deadline, (
                f"partition {partition_id}: high-water mark {self.get_client_high_water_mark(partition_id)} "
                f"did not reach {target} within {timeout_s} s"
            )
            await asyncio.sleep(POLL_S)

    def wait_for_high_water_mark_sync(
        self, partition_id: int, target: int, timeout_s: float = WAIT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while self.get_client_high_water_mark(partition_id) < target:
            assert time.monotonic() < deadline, f"partition {partition_id} did not reach {target}"
            time.sleep(POLL_S)
