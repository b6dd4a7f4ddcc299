"""Record and RecordHeader: the unit the storage keeps and the wire carries.

A ``Record`` holds the client-computed data checksum as sent; the storage adds its own
record checksum only on disk (see ``waltz_engine.disk.segment_format``).
"""

from __future__ import annotations

from typing import NamedTuple

from waltz_engine.common.reqid import ReqId


class RecordHeader(NamedTuple):
    transaction_id: int
    req_id: ReqId
    header: int


class Record(NamedTuple):
    transaction_id: int
    req_id: ReqId
    header: int
    data: bytes
    checksum: int

    def record_header(self) -> RecordHeader:
        return RecordHeader(self.transaction_id, self.req_id, self.header)
