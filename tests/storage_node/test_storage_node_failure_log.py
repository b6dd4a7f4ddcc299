"""How a storage node logs a request it failed: a store's refused read of a segment evicted to
the tier is one line with the store's answer (an operational condition, as a full disk), while
an unexpected error keeps its traceback."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.storage.node.partition_worker import PartitionWorker
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
