"""A partition's transaction data on the server: TRANSACTION_DATA answered from the cache, and
its misses read from storage in ranges (a part of :class:`waltz_engine.server.partition.Partition`,
kept apart for size).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.server.transaction_cache import TransactionData, TransactionFetcher
from waltz_engine.wire.client_messages import TransactionDataRequest, TransactionDataResponse

log = logging.getLogger("waltz_engine.server.partition")

DataLoad = tuple[TransactionDataRequest, "asyncio.Future[TransactionData]"]


class CommittedRecords(Protocol):
    async def committed_records(self, transaction_id: int, max_records: int) -> list[Record]: ...


class PartitionData:
    """TRANSACTION_DATA of one partition (the partition's state, which ``Partition`` sets)."""

    partition_id: int
    commit_high_water_mark: int
    closed: bool
    fetcher: TransactionFetcher
    store: CommittedRecords

    async def transaction_data(self, request: TransactionDataRequest) -> TransactionDataResponse:
        answers, loading = self.transaction_data_many([request])
        if answers:
            return answers[0]
        ((_, pending),) = loading
        return await self.data_response(request, pending)

    def transaction_data_many(
        self, requests: list[TransactionDataRequest]
    ) -> tuple[list[TransactionDataResponse], list[DataLoad]]:
        """The answers ready now (cache hits, txids never committed) and the loads to wait for.

        The misses are read from storage in ranges by the fetcher, not one record each.
        """
        answers: list[TransactionDataResponse] = []
        wanted: list[TransactionDataRequest] = []
        high_water_mark = self.commit_high_water_mark
        for request in requests:
            txid = request.transaction_id
            if 0 <= txid <= high_water_mark:
                wanted.append(request)
            else:
                error = TransactionNotFoundError(f"transaction {txid} not found")
                answers.append(_data_error(request, error))
        loading: list[DataLoad] = []
        if wanted:
            found = self.fetcher.fetch_many(
                self.partition_id, [request.transaction_id for request in wanted], self._load_range
            )
            for request, data in zip(wanted, found, strict=True):
                if isinstance(data, tuple):
                    answers.append(TransactionDataResponse(request.req_id, request.transaction_id, *data))
                else:
                    loading.append((request, data))
        return answers, loading

    async def data_response(
        self, request: TransactionDataRequest, pending: asyncio.Future[TransactionData]
    ) -> TransactionDataResponse:
        txid = request.transaction_id
        try:
            data, checksum = await asyncio.shield(pending)
        except (WaltzError, OSError, TimeoutError) as e:
            if not self.closed:
                log.warning("partition %d: transaction data of %d: %s", self.partition_id, txid, e)
            return _data_error(request, e)
        return TransactionDataResponse(request.req_id, txid, data, checksum)

    async def _load_range(self, first: int, count: int) -> list[TransactionData]:
        """``count`` committed transactions from ``first``: RECORD_LIST reads, as many as it takes."""
        found: list[TransactionData] = []
        while len(found) < count:
            next_txid = first + len(found)
            records = await self.store.committed_records(next_txid, count - len(found))
            if not records:
                raise TransactionNotFoundError(f"transaction {next_txid} not found")
            for record in records:
                if record.transaction_id != first + len(found):
                    raise TransactionNotFoundError(f"transaction {first + len(found)} not found")
                found.append((record.data, record.checksum))
        return found[:count]


class TransactionNotFoundError(WaltzError):
    """A TRANSACTION_DATA_REQUEST for a txid this partition has not committed."""


def _data_error(request: TransactionDataRequest, error: BaseException) -> TransactionDataResponse:
    return TransactionDataResponse(
        request.req_id, request.transaction_id, exception_message=f"{type(error).__name__}: {error}"
    )
