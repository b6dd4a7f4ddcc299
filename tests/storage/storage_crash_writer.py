"""A deterministic storage workload, run as a child process the crash test SIGKILLs.

``python storage_crash_writer.py <directory> <seed>`` opens the directory (recovering it),
then applies ``Workload(seed, state)`` ops forever, printing ``done <n>`` after op ``n``
returned. The test rebuilds the same ops from the same seed and recovered state.
"""

from __future__ import annotations

import random
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.storage import SessionInfo, StorageManager

KEY = uuid.UUID("0e3c3d1e-8a4b-4e0e-9a57-6f7c7a0c2f11")
NUM_PARTITIONS = 1
PARTITION = 0
# Small segments so that a run crosses many rollovers.
THRESHOLD_BYTES = 4096
MAX_BATCH_RECORDS = 60
MAX_DATA_BYTES = 100
MAX_TRUNCATE_DEPTH = 40


class Append(NamedTuple):
    records: list[Record]


class Truncate(NamedTuple):
    transaction_id: int


class SetLowWaterMark(NamedTuple):
    session_id: int
    low_water_mark: int


Op = Append | Truncate | SetLowWaterMark


@dataclass
class Model:
    records: list[Record] = field(default_factory=list)
    session: SessionInfo = SessionInfo(-1, -1, -1)

    @property
    def max_transaction_id(self) -> int:
        return len(self.records) - 1

    def apply(self, op: Op) -> None:
        if isinstance(op, Append):
            self.records += op.records
        elif isinstance(op, Truncate):
            del self.records[op.transaction_id + 1 :]
        else:
            self.session = SessionInfo(op.session_id, op.low_water_mark, self.max_transaction_id)


class Workload:
    """Valid requests only, as a server sends them: truncation never below the local low-water mark."""

    def __init__(self, seed: int, model: Model) -> None:
        self.rng = random.Random(seed)
        self.model = model
        self.seed = seed

    def next_op(self) -> Op:
        rng, model = self.rng, self.model
        roll = rng.random()
        top = model.max_transaction_id
        op: Op
        if roll < 0.65:
            first = top + 1
            op = Append([self._record(first + i) for i in range(rng.randint(1, MAX_BATCH_RECORDS))])
        elif roll < 0.8:
            floor = max(model.session.local_low_water_mark, top - MAX_TRUNCATE_DEPTH, -1)
            op = Truncate(rng.randint(floor, top))
        else:
            lwm = max(model.session.low_water_mark, top) + rng.randint(0, 3)
            op = SetLowWaterMark(model.session.session_id + 1, lwm)
        model.apply(op)
        return op

    def _record(self, transaction_id: int) -> Record:
        data = self.rng.randbytes(self.rng.randint(0, MAX_DATA_BYTES))
        req_id = ReqId(self.seed & 0x7FFFFFFF, 1, PARTITION, transaction_id)
        return Record(transaction_id, req_id, transaction_id % 1000, data, crc32(data))


def open_manager(directory: Path) -> StorageManager:
    manager = StorageManager(directory, KEY, NUM_PARTITIONS, segment_size_threshold_bytes=THRESHOLD_BYTES)
    if not manager.partition_info(PARTITION).is_assigned:
        manager.set_partition_assignment([PARTITION], True)
    return manager


def read_model(manager: StorageManager) -> Model:
    partition = manager.partition(PARTITION)
    records = partition.records(0, partition.max_transaction_id() + 1)
    return Model(records, partition.last_session_info())


def main() -> None:
    directory, seed = Path(sys.argv[1]), int(sys.argv[2])
    manager = open_manager(directory)
    partition = manager.partition(PARTITION)
    workload = Workload(seed, read_model(manager))
    print("ready", flush=True)
    n = 0
    while True:
        op = workload.next_op()
        if isinstance(op, Append):
            partition.append(op.records)
        elif isinstance(op, Truncate):
            partition.truncate(op.transaction_id)
        else:
            partition.set_low_water_mark(op.session_id, op.low_water_mark)
        print(f"done {n}", flush=True)
        n += 1


if __name__ == "__main__":
    main()
