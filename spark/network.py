"""Records read over the network (:mod:`waltz_engine.storage.network_reader`) as Arrow batches of
:data:`spark.schema.ARROW_SCHEMA`, and the one function every reader of a slice calls."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from spark.schema import ARROW_SCHEMA
from spark.segments import SegmentSlice, read_slice
from waltz_engine.common.record import Record
from waltz_engine.storage.network_reader import NetworkSlice, read_slice_records


def records_batch(partition_id: int, records: Sequence[Record]) -> pa.RecordBatch:
    txids, req_ids, headers, data, checksums = zip(*records, strict=True)
    client_ids, generations, _, seq_nums = zip(*req_ids, strict=True)
    types = [f.type for f in ARROW_SCHEMA]
    columns = [
        pa.repeat(pa.scalar(partition_id, types[0]), len(records)),
        pa.array(txids, types[1]),
        pa.array(client_ids, types[2]),
        pa.array(generations, types[3]),
        pa.array(seq_nums, types[4]),
        pa.array(headers, types[5]),
        pa.array(data, types[6]),
        pa.array(checksums, types[7]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def read_part(part: SegmentSlice | NetworkSlice, on_corrupt: str) -> Iterator[pa.RecordBatch]:
    """The records of a slice, in txid order: local segment files or the storage nodes."""
    if isinstance(part, NetworkSlice):
        for records in read_slice_records(part):
            yield records_batch(part.partition_id, records)
    else:
        yield from read_slice(part, on_corrupt)
