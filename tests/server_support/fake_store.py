"""An in-memory store with the store layer's interface, for the server engine's tests.

Appends commit in batches on the next loop iteration (like quorum acks arriving), in txid order,
unless the test holds them (``hold()`` / ``release()``) or makes the next ones fail.
"""

from __future__ import annotations

import asyncio

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.store.errors import RetainedStartError

FAKE_MAX_BATCH_SIZE = 100


class FakeGenerationMismatchError(WaltzError):
    pass


class _Pending:
    __slots__ = ("req_id", "header", "data", "checksum", "future")

    def __init__(self, req_id: ReqId, header: int, data: bytes, checksum: int, future: asyncio.Future[int]):
        self.req_id = req_id
        self.header = header
        self.data = data
        self.checksum = checksum
        self.future = future


class FakeStorePartition:
    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id
        self.generation = -1
        self.records: list[Record] = []
        self.healthy = True
        self.held = False
        self.fail_next = 0
        # Raised by the next flush or append: an unexpected failure inside the store layer.
        self.flush_error: BaseException | None = None
        self.append_error: BaseException | None = None
        self.max_pending_seen = 0
        self.record_header_calls = 0
        self.record_calls = 0
        self.record_list_calls = 0
        self.opened_generation: int | None = None
        self.ensure_open_calls = 0
        self.recovered_high_water_mark = -1
        # Retention removed the records below it: reads of them fail, as the store's do.
        self.retained_start = 0
        self._elsewhere: list[Record] = []
        self._pending: list[_Pending] = []
        self._changed = asyncio.Condition()
        self._scheduled = False

    @property
    def high_water_mark(self) -> int:
        return len(self.records) - 1

    @property
    def low_water_mark(self) -> int:
        return self.recovered_high_water_mark

    async def set_generation(self, generation: int) -> None:
        self.generation = max(self.generation, generation)

    async def ensure_open(self) -> None:
        """As a new session would: resolved at the records committed so far (and every pending
        append of the previous one decided: they commit in order here)."""
        if self.opened_generation != self.generation:
            self.ensure_open_calls += 1
            self.opened_generation = self.generation
            self.records.extend(self._elsewhere)
            self._elsewhere.clear()
            self.recovered_high_water_mark = self.high_water_mark

    def commit_elsewhere(self, records: list[Record]) -> None:
        """Records another owner committed: only a session opened at a newer generation sees them."""
        self._elsewhere.extend(records)

    def fail_pending(self, error: BaseException) -> None:
        """The store gives up on the held appends without deciding them (their futures raise)."""
        pending, self._pending = self._pending, []
        for p in pending:
            p.future.set_exception(error)

    async def append(self, req_id: ReqId, header: int, data: bytes, checksum: int) -> asyncio.Future[int]:
        error, self.append_error = self.append_error, None
        if error is not None:
            raise error
        if req_id.generation != self.generation:
            raise FakeGenerationMismatchError(f"generation {req_id.generation} != {self.generation}")
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._pending) <= 2 * FAKE_MAX_BATCH_SIZE)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(req_id, header, data, checksum, future))
        self.max_pending_seen = max(self.max_pending_seen, len(self._pending))
        self._schedule()
        return future

    def _schedule(self) -> None:
        if not self.held and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._commit_all)

    def _commit_all(self) -> None:
        self._scheduled = False
        if self.held:
            return
        pending, self._pending = self._pending, []
        for p in pending:
            if self.fail_next > 0:
                self.fail_next -= 1
                p.future.set_result(-1)
                continue
            txid = len(self.records)
            self.records.append(Record(txid, p.req_id, p.header, p.data, p.checksum))
            p.future.set_result(txid)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False
        self._schedule()

    def num_pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> int:
        error, self.flush_error = self.flush_error, None
        if error is not None:
            raise error
        async with self._changed:
            await self._changed.wait_for(lambda: not self._pending)
        return self.high_water_mark

    def _check_retained(self, transaction_id: int) -> None:
        if transaction_id < self.retained_start:
            raise RetainedStartError(
                f"transaction {transaction_id} is below the retained start {self.retained_start}",
                self.retained_start,
            )

    async def record_headers(self, transaction_id: int, max_num: int) -> list[RecordHeader]:
        self.record_header_calls += 1
        self._check_retained(transaction_id)
        return [r.record_header() for r in self.records[transaction_id : transaction_id + max_num]]

    async def record(self, transaction_id: int) -> Record | None:
        self.record_calls += 1
        return self.records[transaction_id] if 0 <= transaction_id < len(self.records) else None

    async def committed_records(self, transaction_id: int, max_records: int) -> list[Record]:
        self.record_list_calls += 1
        self._check_retained(transaction_id)
        return self.records[transaction_id : transaction_id + max_records] if transaction_id >= 0 else []

    def preload(self, records: list[Record]) -> None:
        """Committed history, as if written by an earlier session."""
        assert not self.records
        self.records.extend(records)

    def status(self) -> dict[str, object]:
        return {"generation": self.generation, "hwm": self.high_water_mark}

    async def close(self) -> None:
        return None


class FakeStore:
    def __init__(self, num_partitions: int) -> None:
        self.num_partitions = num_partitions
        self.partitions: dict[int, FakeStorePartition] = {}
        self.removed: list[int] = []
        self.connectivity = {"storage-a:6000": True, "storage-b:6000": False}

    async def start(self) -> None:
        return None

    def partition(self, partition_id: int) -> FakeStorePartition:
        assert 0 <= partition_id < self.num_partitions
        if partition_id not in self.partitions:
            self.partitions[partition_id] = FakeStorePartition(partition_id)
        return self.partitions[partition_id]

    async def remove_partition(self, partition_id: int) -> None:
        self.removed.append(partition_id)

    async def check_connectivity(self) -> dict[str, bool]:
        return dict(self.connectivity)

    def replica_info(self) -> dict[int, list[str]]:
        return {pid: sorted(self.connectivity) for pid in range(self.num_partitions)}

    async def close(self) -> None:
        return None
