"""An APPEND_REQUEST's records part, encoded once for every replica (reference §1.9)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from waltz_engine.common.record import Record
from waltz_engine.wire.primitives import I32, RECORD_PREFIX, write_records


def encode_append_records(records: Sequence[Record]) -> bytes:
    """The records part of an APPEND_REQUEST (count + records), encoded once for many replicas."""
    out = bytearray()
    write_records(out, records)
    return bytes(out)


class AppendEntry(Protocol):
    """What :func:`encode_append_batch` reads of an append (a store session's queue entry)."""

    @property
    def req_id(self) -> tuple[int, int, int, int]: ...

    @property
    def header(self) -> int: ...

    @property
    def data(self) -> bytes: ...

    @property
    def checksum(self) -> int: ...


def encode_append_batch(first_transaction_id: int, entries: Sequence[AppendEntry]) -> bytes:
    """:func:`encode_append_records` of the records that ``entries`` become at consecutive txids
    from ``first_transaction_id``, byte for byte, without making the records (a store session's
    batch is encoded once, on the server's hot path)."""
    pack_prefix = RECORD_PREFIX.pack
    pack_i32 = I32.pack
    parts = [pack_i32(len(entries))]
    transaction_id = first_transaction_id
    for entry in entries:
        data = entry.data
        parts.append(pack_prefix(transaction_id, *entry.req_id, entry.header, len(data)))
        parts.append(data)
        parts.append(pack_i32(entry.checksum))
        transaction_id += 1
    return b"".join(parts)
