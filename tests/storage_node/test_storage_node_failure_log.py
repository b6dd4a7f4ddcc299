"""How a storage node logs and answers a request it failed: a store's refused read of a segment evicted to
the tier is one line with the store's answer (an operational condition, as a full disk), while
an unexpected error keeps its traceback."""

from __future__ import annotations

import asyncio
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.storage.node.admin_handler import AdminHandler
from waltz_engine.storage.node.partition_worker import PartitionWorker
from waltz_engine.wire.admin_messages import (
    AdminFailureResponse,
    AdminOpenRequest,
    AdminRecordListRequest,
    AdminSuccessResponse,
)
from waltz_engine.wire.storage_messages import StorageRecordListRequest

PARTITION_ID = 3
REQUEST = StorageRecordListRequest(1, 7, PARTITION_ID, 0, 10)


def _log_failure(error: BaseException, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    worker: object = SimpleNamespace(partition_id=PARTITION_ID, partition=None)
    with caplog.at_level(logging.INFO, logger="waltz_engine.storage.node.partition_worker"):
        PartitionWorker._log_failure(worker, REQUEST, error)  # type: ignore[arg-type]
    [record] = caplog.records
    return record


def test_a_refused_tier_read_is_one_line_with_the_stores_answer(caplog: pytest.LogCaptureFixture) -> None:
    answer = "s3://tier: cannot read 0/seg: the store answered an error (500)"
    record = _log_failure(ObjectStoreError(answer), caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert record.getMessage() == f"partition {PARTITION_ID}: StorageRecordListRequest failed: {answer}"


def test_an_unexpected_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    record = _log_failure(ZeroDivisionError("unexpected"), caplog)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None


class _Conn:
    """A connection that hands the admin port ``requests`` and keeps what it sends back."""

    peer = "operator:1"

    def __init__(self, requests: list[object]) -> None:
        self.requests: list[object] = list(requests)
        self.sent: list[object] = []

    async def receive(self) -> object | None:
        return self.requests.pop(0) if self.requests else None

    async def send(self, message: object) -> None:
        self.sent.append(message)


def test_the_admin_port_answers_a_refused_tier_read_with_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    """A raw read (a replica move's copy) of a segment evicted to the tier, whose store answered a
    500: the admin port answers FAILURE and logs one line, where the error escaped the
    connection's task (the simulator printed "Task exception was never retrieved")."""
    answer = "s3://tier: cannot read 0/seg: the store answered an error (500)"

    def records_wire(transaction_id: int, max_num_records: int) -> object:
        raise ObjectStoreError(answer)

    partition = SimpleNamespace(records_wire=records_wire)
    manager = SimpleNamespace(open=lambda key, n: None, partition=lambda p: partition)
    conn = _Conn([AdminOpenRequest(1, uuid.UUID(int=1), 4), AdminRecordListRequest(2, PARTITION_ID, 0, 10)])

    async def changed() -> None:
        return None

    with ThreadPoolExecutor(1) as executor:
        handler = AdminHandler(manager, MetricsRegistry(), executor, changed)  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, logger="waltz_engine.storage.node.admin_handler"):
            asyncio.run(handler(conn))  # type: ignore[arg-type]
    assert conn.sent[0] == AdminSuccessResponse(1)
    [failure] = conn.sent[1:]
    assert isinstance(failure, AdminFailureResponse) and failure.seq_num == 2
    assert failure.exception.message is not None and answer in failure.exception.message
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert answer in record.getMessage()
