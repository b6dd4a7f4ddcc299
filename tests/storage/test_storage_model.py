"""Property test: random append/truncate/reopen/low-water-mark sequences against a list model."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from waltz_engine.common.crc import crc32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage import ConcurrentUpdateError, Partition, SessionInfo, StorageManager

KEY = uuid.UUID("5d2b7c1a-1f0e-4a51-9a7e-0b5c8f0e6d42")
# Small enough for frequent rollovers, large enough to keep the number of fsyncs bounded.
THRESHOLD_BYTES = 1024
CACHE_CAPACITY = 2
MAX_DATA_BYTES = 24


def _record(transaction_id: int, data: bytes) -> Record:
    return Record(transaction_id, ReqId(7, 1, 0, transaction_id), -transaction_id, data, crc32(data))


class StorageModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="waltz-storage-model-"))
        self.manager = self._open()
        self.manager.set_partition_assignment([0], True)
        self.records: list[Record] = []
        self.session = SessionInfo(-1, -1, -1)

    def _open(self) -> StorageManager:
        return StorageManager(
            self.directory,
            KEY,
            1,
            segment_size_threshold_bytes=THRESHOLD_BYTES,
            segment_cache_capacity=CACHE_CAPACITY,
        )

    @property
    def partition(self) -> Partition:
        return self.manager.partition(0)

    @rule(payloads=st.lists(st.binary(max_size=MAX_DATA_BYTES), min_size=1, max_size=40))
    def append(self, payloads: list[bytes]) -> None:
        batch = [_record(len(self.records) + i, data) for i, data in enumerate(payloads)]
        self.partition.append(batch)
        self.records += batch

    @rule(count=st.integers(400, 1200))
    def append_many_across_checkpoints(self, count: int) -> None:
        batch = [_record(len(self.records) + i, b"x" * (i % 5)) for i in range(count)]
        self.partition.append(batch)
        self.records += batch

    @rule(gap=st.sampled_from([-1, 1, 2]))
    def append_out_of_order_is_refused(self, gap: int) -> None:
        with pytest.raises(StorageError, match="transaction out of order"):
            self.partition.append([_record(len(self.records) + gap, b"no")])

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        top = len(self.records) - 1
        target = data.draw(st.integers(-1, top + 2))
        assert self.partition.truncate(target) == min(top, target)
        del self.records[target + 1 :]

    @rule(session_delta=st.integers(-1, 2), lwm_delta=st.integers(-2, 3))
    def set_low_water_mark(self, session_delta: int, lwm_delta: int) -> None:
        top = len(self.records) - 1
        session_id = self.session.session_id + session_delta
        lwm = max(self.session.low_water_mark, top) + lwm_delta
        if top > lwm:
            with pytest.raises(StorageError, match="lower than the max transaction id"):
                self.partition.set_low_water_mark(session_id, lwm)
        elif session_id < self.session.session_id:
            with pytest.raises(ConcurrentUpdateError):
                self.partition.set_low_water_mark(session_id, lwm)
        elif lwm < self.session.low_water_mark or top < self.session.local_low_water_mark:
            with pytest.raises(StorageError, match="unable to set"):
                self.partition.set_low_water_mark(session_id, lwm)
        else:
            self.partition.set_low_water_mark(session_id, lwm)
            self.session = SessionInfo(session_id, lwm, top)

    @rule()
    def reopen(self) -> None:
        self.manager.close()
        self.manager = self._open()

    @precondition(lambda self: self.records)
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(-2, len(self.records) + 1))
        count = data.draw(st.integers(0, 120))
        want = self.records[start : start + count] if start >= 0 else []
        assert self.partition.records(start, count) == want
        assert self.partition.record_headers(start, count) == [r.record_header() for r in want]
        single = self.records[start] if 0 <= start < len(self.records) else None
        assert self.partition.record(start) == single
        assert self.partition.record_header(start) == (single.record_header() if single else None)

    @invariant()
    def matches_the_model(self) -> None:
        assert self.partition.max_transaction_id() == len(self.records) - 1
        assert self.partition.last_session_info() == self.session
        segments = self.partition.segments
        assert segments[0][0] == 0 and segments[-1][1] == len(self.records) - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(segments, segments[1:], strict=False))

    def teardown(self) -> None:
        self.manager.close()
        shutil.rmtree(self.directory)


TestStorageModel = pytest.mark.slow(StorageModel.TestCase)
TestStorageModel.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
