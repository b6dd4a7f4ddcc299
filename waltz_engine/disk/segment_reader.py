"""A read-only reader of a segment (``.seg`` data + ``.idx`` index), damage included.

The storage node's own open runs recovery and truncates whatever does not check out; this
reader never does. It opens both files ``rb``, takes no lock, reads with bounded buffers (a
segment can be a gigabyte) and treats the sizes seen at open as the end, so it can look at
the files of a running node. It walks the data file record by record from the header and
compares each record with its index entry, reporting every disagreement as a
:class:`SegmentProblem` instead of hiding it.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from waltz_engine.common.errors import FormatError
from waltz_engine.disk.control_reader import CONTROL_FILE_NAME, require_exists
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES, SegmentFileHeader
from waltz_engine.disk.record_format import (
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
    DiskRecord,
    read_record,
)

SEGMENT_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
SEGMENT_NAME_DIGITS = 19
_SEGMENT_NAME = re.compile(rf"^(\d{{{SEGMENT_NAME_DIGITS}}})\{SEGMENT_SUFFIX}$")

# Reads are buffered in blocks this large; a record larger than a block is read whole.
READ_BLOCK_BYTES = 1 << 20
INDEX_BLOCK_ENTRIES = READ_BLOCK_BYTES // INDEX_ENTRY_SIZE_BYTES
# Offset of the data length inside a record header (after txid, reqId msb, reqId lsb, header).
_DATA_LENGTH_OFFSET = 28
_INT32 = struct.Struct(">i")

# Stable identifiers of what can be wrong; scripts match on these.
KIND_HEADER = "header"
KIND_INDEX_MISSING = "index-missing"
KIND_INDEX_PARTIAL_ENTRY = "index-partial-entry"
KIND_INDEX_MISMATCH = "index-mismatch"
KIND_INDEX_BEYOND_DATA = "index-beyond-data"
KIND_UNINDEXED_RECORD = "unindexed-record"
KIND_TORN_RECORD = "torn-record"
KIND_BAD_RECORD_HEADER = "bad-record-header"
KIND_TXID_MISMATCH = "txid-mismatch"
KIND_CHECKSUM = "checksum"


def segment_file_name(first_transaction_id: int) -> str:
    return f"{first_transaction_id:0{SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def first_txid_from_name(path: Path) -> int | None:
    """The first transaction id a segment's file name claims, None for another name."""
    match = _SEGMENT_NAME.match(path.name)
    return int(match.group(1)) if match else None


def index_path_for(segment_path: Path) -> Path:
    return segment_path.with_suffix(INDEX_SUFFIX)


@dataclass(frozen=True)
class SegmentProblem:
    kind: str
    message: str
    transaction_id: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class SegmentRecord:
    record: DiskRecord
    # False when the index has no entry for this record or the entry points elsewhere.
    index_ok: bool


ScanItem = SegmentRecord | SegmentProblem


class _BlockReader:
    """Positional reads through one buffered block, never past the size seen at open."""

    def __init__(self, file: BinaryIO, size_bytes: int) -> None:
        self._fd = file.fileno()
        self.size_bytes = size_bytes
        self._start = 0
        self._block = b""

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; fewer at the end (or if the file shrank)."""
        assert offset >= 0 and length >= 0
        length = max(0, min(length, self.size_bytes - offset))
        if length == 0:
            return b""
        end = offset + length
        if not (self._start <= offset and end <= self._start + len(self._block)):
            want = min(max(length, READ_BLOCK_BYTES), self.size_bytes - offset)
            self._block = os.pread(self._fd, want, offset)
            self._start = offset
        return self._block[offset - self._start : end - self._start]


class SegmentReader:
    """An open segment; use as a context manager. Raises FormatError only for a non-segment."""

    def __init__(self, path: Path) -> None:
        if path.suffix == INDEX_SUFFIX:
            path = path.with_suffix(SEGMENT_SUFFIX)
        require_exists(path)
        if path.is_dir():
            raise FormatError(f"{path}: is a directory, expected a {SEGMENT_SUFFIX} file")
        if path.name == CONTROL_FILE_NAME:
            raise FormatError(f"{path}: this is the control file (see `waltz inspect control`)")
        if path.suffix != SEGMENT_SUFFIX:
            raise FormatError(f"{path}: not a segment: expected a {SEGMENT_SUFFIX} file")
        self.path = path
        self.index_path = index_path_for(path)
        self._data_file = path.open("rb")
        self._index_file: BinaryIO | None = None
        try:
            self._data = _BlockReader(self._data_file, os.fstat(self._data_file.fileno()).st_size)
            self.header = _read_header(self._data, path)
            self.header_problems: list[SegmentProblem] = []
            self._index: _BlockReader | None = None
            self.index_header: SegmentFileHeader | None = None
            self._open_index()
            self._check_names()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._data_file.close()
        if self._index_file is not None:
            self._index_file.close()

    @property
    def data_size_bytes(self) -> int:
        return self._data.size_bytes

    @property
    def index_entry_count(self) -> int:
        if self._index is None:
            return 0
        return (self._index.size_bytes - HEADER_SIZE_BYTES) // INDEX_ENTRY_SIZE_BYTES

    def _problem(self, kind: str, message: str) -> None:
        self.header_problems.append(SegmentProblem(kind, message))

    def _open_index(self) -> None:
        try:
            self._index_file = self.index_path.open("rb")
        except FileNotFoundError:
            self._problem(KIND_INDEX_MISSING, f"index file {self.index_path.name} is missing")
            return
        index = _BlockReader(self._index_file, os.fstat(self._index_file.fileno()).st_size)
        try:
            self.index_header = _read_header(index, self.index_path)
        except FormatError as e:
            self._problem(KIND_INDEX_MISSING, f"index file unusable: {e}")
            return
        self._index = index
        partial = (index.size_bytes - HEADER_SIZE_BYTES) % INDEX_ENTRY_SIZE_BYTES
        if partial:
            self._problem(
                KIND_INDEX_PARTIAL_ENTRY,
                f"index ends with {partial} bytes of a partial entry (ignored)",
            )
        data, idx = self.header, self.index_header
        for field in ("key", "partition_id", "first_transaction_id"):
            if getattr(data, field) != getattr(idx, field):
                self._problem(
                    KIND_HEADER,
                    f"index header {field} {getattr(idx, field)} differs from the data header's "
                    f"{getattr(data, field)}",
                )

    def _check_names(self) -> None:
        named = first_txid_from_name(self.path)
        if named is None:
            self._problem(KIND_HEADER, f"file name is not <{SEGMENT_NAME_DIGITS} digits>{SEGMENT_SUFFIX}")
        elif named != self.header.first_transaction_id:
            self._problem(
                KIND_HEADER,
                f"file name says first txid {named}, header says {self.header.first_transaction_id}",
            )

    def _index_entries(self, start: int) -> Iterator[int]:
        """Index entries from entry number ``start`` on, read a block at a time."""
        if self._index is None:
            return
        count = self.index_entry_count
        for block_start in range(start, count, INDEX_BLOCK_ENTRIES):
            n = min(INDEX_BLOCK_ENTRIES, count - block_start)
            raw = self._index.read(
                HEADER_SIZE_BYTES + block_start * INDEX_ENTRY_SIZE_BYTES, n * INDEX_ENTRY_SIZE_BYTES
            )
            yield from (entry for (entry,) in INDEX_ENTRY.iter_unpack(raw))

    def record_at(self, offset: int) -> DiskRecord | SegmentProblem:
        """The whole record at ``offset``, or why there is none (torn or nonsensical)."""
        available = self._data.size_bytes - offset
        if available < RECORD_HEADER_SIZE_BYTES:
            return SegmentProblem(
                KIND_TORN_RECORD,
                f"incomplete record at offset {offset}: {max(available, 0)} bytes, "
                f"not even the {RECORD_HEADER_SIZE_BYTES}-byte record header",
                offset=offset,
            )
        head = self._data.read(offset, RECORD_HEADER_SIZE_BYTES)
        (length,) = _INT32.unpack_from(head, _DATA_LENGTH_OFFSET)
        if length < 0:
            return SegmentProblem(
                KIND_BAD_RECORD_HEADER,
                f"record at offset {offset} has a negative data length {length}",
                offset=offset,
            )
        size = RECORD_OVERHEAD_BYTES + length
        raw = self._data.read(offset, size)
        if len(raw) < size:
            return SegmentProblem(
                KIND_TORN_RECORD,
                f"incomplete record at offset {offset}: {len(raw)} of its {size} bytes",
                offset=offset,
            )
        found = read_record(raw, 0)
        assert isinstance(found, DiskRecord), "a record of its full size always parses"
        return found._replace(offset=offset)

    def scan(self, start_transaction_id: int | None = None) -> Iterator[ScanItem]:
        """Every record and problem in file order, from ``start_transaction_id`` if the index has it."""
        first = self.header.first_transaction_id
        position, number = HEADER_SIZE_BYTES, 0
        if start_transaction_id is not None and self.index_entry_count > 0:
            # Jump via the index to the wanted entry (or the last one, records may follow it);
            # an entry that cannot be a record start is ignored and the walk begins at the top.
            wanted = min(max(start_transaction_id - first, 0), self.index_entry_count - 1)
            entry = next(self._index_entries(wanted))
            if HEADER_SIZE_BYTES <= entry < self._data.size_bytes:
                position, number = entry, wanted
        yield from self._walk(position, number)

    def _walk(self, position: int, number: int) -> Iterator[ScanItem]:
        first = self.header.first_transaction_id
        entries = self._index_entries(number)
        index_count = self.index_entry_count
        while True:
            txid = first + number
            entry = next(entries, None)
            if position >= self._data.size_bytes:
                if entry is not None:
                    yield SegmentProblem(
                        KIND_INDEX_BEYOND_DATA,
                        f"the index lists txids {txid}..{first + index_count - 1} "
                        f"but the data file ends at offset {position}",
                        transaction_id=txid,
                        offset=entry,
                    )
                return
            found = self.record_at(position)
            if isinstance(found, SegmentProblem):
                yield self._tail_problem(found, txid, entry, index_count)
                return
            index_ok = entry == position
            if found.record.transaction_id != txid:
                yield SegmentProblem(
                    KIND_TXID_MISMATCH,
                    f"record at offset {position} has txid {found.record.transaction_id}, expected {txid}",
                    transaction_id=txid,
                    offset=position,
                )
            if entry is None and self._index is not None:
                yield SegmentProblem(
                    KIND_UNINDEXED_RECORD,
                    f"whole record at offset {position} is not in the index (which ends at txid "
                    f"{first + index_count - 1})",
                    transaction_id=txid,
                    offset=position,
                )
            elif entry is not None and not index_ok:
                yield SegmentProblem(
                    KIND_INDEX_MISMATCH,
                    f"the index entry is offset {entry} ({self._describe(entry)}) "
                    f"but the record is at offset {position}",
                    transaction_id=txid,
                    offset=position,
                )
            if not (found.checksum_ok and found.record_checksum_ok):
                failed = [
                    name
                    for name, ok in (("data", found.checksum_ok), ("record", found.record_checksum_ok))
                    if not ok
                ]
                yield SegmentProblem(
                    KIND_CHECKSUM,
                    f"{' and '.join(failed)} checksum mismatch at offset {position}",
                    transaction_id=found.record.transaction_id,
                    offset=position,
                )
            yield SegmentRecord(found, index_ok)
            position += found.size_bytes
            number += 1

    def _tail_problem(
        self, found: SegmentProblem, txid: int, entry: int | None, index_count: int
    ) -> SegmentProblem:
        first = self.header.first_transaction_id
        if entry is None:
            listed = "not in the index"
        elif txid == first + index_count - 1:
            listed = "the index lists it"
        else:
            listed = f"the index lists it and {first + index_count - 1 - txid} more"
        return SegmentProblem(found.kind, f"{found.message}; {listed}", txid, found.offset)

    def _describe(self, offset: int) -> str:
        if not HEADER_SIZE_BYTES <= offset < self._data.size_bytes:
            return "outside the data file"
        found = self.record_at(offset)
        if isinstance(found, SegmentProblem):
            return "not the start of a whole record"
        return f"a record with txid {found.record.transaction_id}"


def _read_header(reader: _BlockReader, path: Path) -> SegmentFileHeader:
    raw = reader.read(0, HEADER_SIZE_BYTES)
    if len(raw) < HEADER_SIZE_BYTES:
        raise FormatError(
            f"{path}: not a segment file: {len(raw)} bytes, shorter than the {HEADER_SIZE_BYTES}-byte header"
        )
    try:
        return SegmentFileHeader.from_bytes(raw)
    except FormatError as e:
        raise FormatError(f"{path}: not a segment file: {e}") from e
