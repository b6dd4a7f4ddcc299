"""The part of the store layer's StorePartition that a server partition uses (a Protocol, so
the partition engine is tested and simulated with other stores)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.common.reqid import ReqId


class StorePartitionLike(Protocol):
    """The part of the store layer's StorePartition this engine uses."""

    partition_id: int

    async def set_generation(self, generation: int) -> None: ...

    async def append(self, req_id: ReqId, header: int, data: bytes, checksum: int) -> asyncio.Future[int]: ...

    async def flush(self) -> int: ...

    @property
    def high_water_mark(self) -> int: ...

    @property
    def low_water_mark(self) -> int:
        """The high-water mark the current store session's recovery resolved (all committed)."""
        ...

    async def ensure_open(self) -> None: ...

    async def record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]: ...

    async def record(self, transaction_id: int) -> Record | None: ...

    async def committed_records(self, transaction_id: int, max_records: int) -> list[Record]: ...

    @property
    def healthy(self) -> bool: ...
