"""One segment: a ``.seg`` data file and its ``.idx`` index, written as the original does.

Rules (reference §1.5, §1.6):

* Records are appended with consecutive txids. The data file is synced (``fdatasync``) once
  per append call; index entries are written but synced only at a checkpoint, i.e. right
  after the record whose next txid is a multiple of ``CHECKPOINT_INTERVAL`` (then both files
  are ``fsync``ed). An append stops early once the segment is larger than the threshold.
* Within a call, data is written *before* the index entries that point at it. Recovery
  trusts the index entry of the scan start (a checkpoint or the local low-water mark) when
  the index extends past it, so that entry must never point at data that is not there yet.
* On open, recovery re-validates records from the last checkpoint (or the local low-water
  mark), rebuilds their index entries and cuts a torn or dirty tail.
"""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.common.fileio import fsync_directory, pread_upto, pwrite_all
from waltz_engine.common.record import Record, RecordHeader
from waltz_engine.disk.file_header import FORMAT_VERSION, HEADER_SIZE_BYTES, SegmentFileHeader
from waltz_engine.disk.record_format import (
    CHECKPOINT_INTERVAL,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE_BYTES,
    RECORD_CRC,
    RECORD_HEADER,
    RECORD_HEADER_SIZE_BYTES,
    RECORD_OVERHEAD_BYTES,
    DiskRecord,
    encode_records,
    read_record,
)

_NO_FD = -1
# What a corrupt record's error says first; the server recognises the storage FAILURE by it
# (``waltz_engine.server.store.store_session``) and reads the record from another replica.
CORRUPT_RECORD_MESSAGE = "corrupt record"


class CorruptRecordError(StorageError):
    """A record fails its CRC (over header and data) or its data checksum: never served.

    A ``StorageError``, so the node answers the request with a FAILURE naming the record.
    """

    def __init__(
        self, partition_id: int, transaction_id: int, seg_path: Path, offset: int, what: str
    ) -> None:
        super().__init__(
            f"{CORRUPT_RECORD_MESSAGE}: partition {partition_id} transaction {transaction_id}: {what} "
            f"({seg_path} offset {offset})"
        )
        self.partition_id = partition_id
        self.transaction_id = transaction_id


def _java_div(dividend: int, divisor: int) -> int:
    """Integer division truncating toward zero, as Java's ``/`` on longs."""
    quotient = abs(dividend) // divisor
    return -quotient if dividend < 0 else quotient


def create_segment_files(
    key: uuid.UUID,
    partition_id: int,
    seg_path: Path,
    idx_path: Path,
    first_transaction_id: int,
    clock_ms: Callable[[], int],
) -> None:
    """Create an empty segment: the index header first, then the data header, each synced.

    Each file takes its own creation time, as the original's.
    """
    for path in (idx_path, seg_path):
        header = SegmentFileHeader(FORMAT_VERSION, clock_ms(), key, partition_id, first_transaction_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            pwrite_all(fd, header.to_bytes(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_directory(seg_path.parent)


class Segment:
    """A segment's open files and its write position. Not thread-safe: the partition serializes.

    A sealed (read-only) segment may have its files closed by the partition's LRU cache and
    reopened lazily with ``ensure_open``.
    """

    def __init__(
        self,
        seg_path: Path,
        idx_path: Path,
        header: SegmentFileHeader,
        seg_fd: int,
        idx_fd: int,
        segment_size_threshold_bytes: int,
    ) -> None:
        self.seg_path = seg_path
        self.idx_path = idx_path
        self.header = header
        self._seg_fd = seg_fd
        self._idx_fd = idx_fd
        self._threshold_bytes = segment_size_threshold_bytes
        self._next_transaction_id = header.first_transaction_id
        self._next_offset = HEADER_SIZE_BYTES
        self.writable = False
        self.closed = False

    # --- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        key: uuid.UUID,
        partition_id: int,
        seg_path: Path,
        idx_path: Path,
        local_low_water_mark: int,
        segment_size_threshold_bytes: int,
    ) -> Segment:
        """Open both files, check their headers and run start-up recovery."""
        seg_fd = idx_fd = _NO_FD
        try:
            seg_fd = os.open(seg_path, os.O_RDWR)
            idx_fd = os.open(idx_path, os.O_RDWR)
            header = cls._read_header(seg_fd, seg_path, key, partition_id)
            index_header = cls._read_header(idx_fd, idx_path, key, partition_id)
            if index_header.first_transaction_id != header.first_transaction_id:
                raise FormatError(
                    f"{idx_path}: first transaction id {index_header.first_transaction_id} does not "
                    f"match the data file's {header.first_transaction_id}"
                )
            segment = cls(seg_path, idx_path, header, seg_fd, idx_fd, segment_size_threshold_bytes)
            segment._recover(local_low_water_mark)
            return segment
        except BaseException:
            for fd in (seg_fd, idx_fd):
                if fd != _NO_FD:
                    os.close(fd)
            raise

    @staticmethod
    def _read_header(fd: int, path: Path, key: uuid.UUID, partition_id: int) -> SegmentFileHeader:
        try:
            header = SegmentFileHeader.from_bytes(pread_upto(fd, HEADER_SIZE_BYTES, 0))
        except FormatError as e:
            raise FormatError(f"failed to open segment file {path}: {e}") from e
        if header.key != key:
            raise StorageError(f"failed to open segment file {path}: the cluster key does not match")
        if header.partition_id != partition_id:
            raise StorageError(f"failed to open segment file {path}: partition id does not match")
        return header

    def _recover(self, local_low_water_mark: int) -> None:
        """The original's ``Segment.recover``: validate from the last stable point, cut the rest.

        What this promises after a crash (kill -9, power loss), record by record as the original:
        every record kept is whole and its checksum verifies; the records kept are consecutive (the
        scan stops at the first torn, dirty or out-of-order record and everything from there on is
        cut: never a gap); every record of an acknowledged append is kept (SUCCESS is sent only
        once its data is synced). An append is not atomic on one node: a crash inside its data
        write keeps a prefix of its records, whole, and cuts the rest. Whole appends across the
        replicas are the server's recovery's business (it settles a partial append, §2.7).
        """
        first = self.header.first_transaction_id
        max_transaction_id = self._index_max_transaction_id()
        if max_transaction_id <= local_low_water_mark:
            transaction_id = max_transaction_id
        else:
            checkpoint = _java_div(max_transaction_id - 1, CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
            transaction_id = max(checkpoint, local_low_water_mark)

        if transaction_id <= first:
            transaction_id = first
            offset = HEADER_SIZE_BYTES
        else:
            offset = self._index_get(transaction_id)
            if offset < 0:
                raise FormatError(f"{self.seg_path}: segment corrupted: index corrupted")
            size_bytes = self._check_record(offset, transaction_id)
            if size_bytes < 0:
                raise FormatError(f"{self.seg_path}: segment corrupted: record corrupted")
            offset += size_bytes
            transaction_id += 1

        rebuilt = bytearray()
        rebuilt_from = transaction_id
        while (size_bytes := self._check_record(offset, transaction_id)) >= 0:
            rebuilt += INDEX_ENTRY.pack(offset)
            offset += size_bytes
            transaction_id += 1

        pwrite_all(self._idx_fd, rebuilt, self._index_position(rebuilt_from))
        os.ftruncate(self._idx_fd, self._index_position(transaction_id))
        os.ftruncate(self._seg_fd, offset)
        self.flush()
        self._next_transaction_id = transaction_id
        self._next_offset = offset

    def _check_record(self, offset: int, transaction_id: int) -> int:
        """The size of the valid record ``transaction_id`` at ``offset``, or -1."""
        head = pread_upto(self._seg_fd, RECORD_HEADER_SIZE_BYTES, offset)
        if len(head) < RECORD_HEADER_SIZE_BYTES:
            return -1
        stored_txid, _, _, _, data_length, _ = RECORD_HEADER.unpack(head)
        if stored_txid != transaction_id or data_length < 0:
            return -1
        rest = pread_upto(self._seg_fd, data_length + RECORD_CRC.size, offset + RECORD_HEADER_SIZE_BYTES)
        if len(rest) < data_length + RECORD_CRC.size:
            return -1
        crc = zlib.crc32(memoryview(rest)[:data_length], zlib.crc32(head))
        (stored_crc,) = RECORD_CRC.unpack_from(rest, data_length)
        return RECORD_OVERHEAD_BYTES + data_length if to_signed32(crc) == stored_crc else -1

    # --- state ---------------------------------------------------------------------------

    @property
    def first_transaction_id(self) -> int:
        return self.header.first_transaction_id

    @property
    def next_transaction_id(self) -> int:
        return self._next_transaction_id

    @property
    def max_transaction_id(self) -> int:
        return self._next_transaction_id - 1

    @property
    def size_bytes(self) -> int:
        return self._next_offset

    @property
    def files_open(self) -> bool:
        return self._seg_fd != _NO_FD

    def _index_position(self, transaction_id: int) -> int:
        return HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (
            transaction_id - self.header.first_transaction_id
        )

    def _index_max_transaction_id(self) -> int:
        entries = (os.fstat(self._idx_fd).st_size - HEADER_SIZE_BYTES) // INDEX_ENTRY_SIZE_BYTES
        return self.header.first_transaction_id + entries - 1

    def _index_get(self, transaction_id: int) -> int:
        """The data offset of ``transaction_id`` from the index file, -1 past its end."""
        position = self._index_position(transaction_id)
        assert position >= HEADER_SIZE_BYTES, f"illegal record position: {position}"
        entry = pread_upto(self._idx_fd, INDEX_ENTRY_SIZE_BYTES, position)
        return INDEX_ENTRY.unpack(entry)[0] if len(entry) == INDEX_ENTRY_SIZE_BYTES else -1

    # --- writing -------------------------------------------------------------------------

    def append(self, records: Sequence[Record], start: int) -> int:
        """Append ``records[start:]`` until the segment passes its threshold; return the new start.

        The caller checked the txids are consecutive; the first must be the next one here.
        """
        assert self.writable and not self.closed, f"{self.seg_path}: segment not writable"
        assert start < len(records)
        if records[start].transaction_id != self._next_transaction_id:
            raise StorageError("transaction out of order")
        end = start
        offset = self._next_offset
        while end < len(records):
            offset += RECORD_OVERHEAD_BYTES + len(records[end].data)
            end += 1
            if offset > self._threshold_bytes:
                break
        try:
            self._write(records[start:end] if start or end < len(records) else records)
        except OSError:
            # Cut whatever part of the batch reached the files, so the next append starts clean.
            os.ftruncate(self._idx_fd, self._index_position(self._next_transaction_id))
            os.ftruncate(self._seg_fd, self._next_offset)
            raise
        return end

    def _write(self, chunk: Sequence[Record]) -> None:
        base_offset = self._next_offset
        data, index = encode_records(chunk, base_offset)
        data_view, index_view = memoryview(data), memoryview(index)
        first_transaction_id = self._next_transaction_id
        count = len(chunk)
        synced = False
        done = 0
        while done < count:
            # Split after the record whose next txid is a checkpoint: the original syncs there.
            cut = min(count, done + CHECKPOINT_INTERVAL - (first_transaction_id + done) % CHECKPOINT_INTERVAL)
            data_from = self._next_offset - base_offset
            data_to = (
                len(data)
                if cut == count
                else INDEX_ENTRY.unpack_from(index, cut * INDEX_ENTRY_SIZE_BYTES)[0] - base_offset
            )
            pwrite_all(self._seg_fd, data_view[data_from:data_to], self._next_offset)
            pwrite_all(
                self._idx_fd,
                index_view[done * INDEX_ENTRY_SIZE_BYTES : cut * INDEX_ENTRY_SIZE_BYTES],
                self._index_position(first_transaction_id + done),
            )
            self._next_offset = base_offset + data_to
            self._next_transaction_id = first_transaction_id + cut
            synced = self._next_transaction_id % CHECKPOINT_INTERVAL == 0
            if synced:
                self.flush()
            done = cut
        if not synced:
            os.fdatasync(self._seg_fd)

    def truncate(self, transaction_id: int) -> None:
        """Drop every record after ``transaction_id``: the index first, then the data, synced."""
        assert not self.closed
        if transaction_id + 1 == self._next_transaction_id:
            return
        if not self.first_transaction_id <= transaction_id + 1 <= self._next_transaction_id:
            raise StorageError(f"transaction id out of range: file={self.seg_path}")
        offset = self._index_get(transaction_id + 1)
        if offset < 0:
            raise FormatError(f"{self.seg_path}: corrupted index at transaction {transaction_id + 1}")
        # Index first: a crash in between leaves records past the index, which recovery keeps
        # (the truncate did not return), never an index pointing past the data.
        os.ftruncate(self._idx_fd, self._index_position(transaction_id + 1))
        os.fsync(self._idx_fd)
        os.ftruncate(self._seg_fd, offset)
        os.fsync(self._seg_fd)
        self._next_offset = offset
        self._next_transaction_id = transaction_id + 1

    def flush(self) -> None:
        os.fsync(self._idx_fd)
        os.fsync(self._seg_fd)

    # --- reading -------------------------------------------------------------------------

    def _read_span(self, transaction_id: int, max_records: int) -> list[DiskRecord]:
        """Records ``transaction_id`` .. at most ``max_records``, read with two preads.

        Every record is checked (its CRC over header and data, and its data checksum) before it
        leaves: a bad one ends the span before it, or raises :class:`CorruptRecordError` when it
        is the first one asked for.
        """
        assert self.files_open and transaction_id >= self.first_transaction_id
        count = min(max_records, self._next_transaction_id - transaction_id)
        if count <= 0:
            return []
        raw_index = pread_upto(
            self._idx_fd, INDEX_ENTRY_SIZE_BYTES * count, self._index_position(transaction_id)
        )
        count = len(raw_index) // INDEX_ENTRY_SIZE_BYTES
        offsets = [INDEX_ENTRY.unpack_from(raw_index, i * INDEX_ENTRY_SIZE_BYTES)[0] for i in range(count)]
        if count == 0:
            return []
        if offsets[0] < HEADER_SIZE_BYTES:
            raise FormatError(f"{self.idx_path}: index corrupted at transaction {transaction_id}")
        last_txid = transaction_id + count - 1
        end = self._next_offset if last_txid == self.max_transaction_id else self._index_get(last_txid + 1)
        buf = pread_upto(self._seg_fd, end - offsets[0], offsets[0])
        result: list[DiskRecord] = []
        for i, offset in enumerate(offsets):
            parsed = read_record(buf, offset - offsets[0])
            if not isinstance(parsed, DiskRecord):
                raise FormatError(f"{self.seg_path}: {parsed.reason}")
            if parsed.record.transaction_id != transaction_id + i:
                raise FormatError(
                    f"{self.seg_path}: transaction id mismatch at transaction {transaction_id + i}"
                )
            if not (parsed.record_checksum_ok and parsed.checksum_ok):
                if result:
                    break  # serve the good records before it; a read starting at it fails
                what = (
                    "record checksum mismatch" if not parsed.record_checksum_ok else "data checksum mismatch"
                )
                raise CorruptRecordError(
                    self.header.partition_id, transaction_id, self.seg_path, offset, what
                )
            result.append(parsed)
        return result

    def read_records(self, transaction_id: int, max_records: int) -> list[Record]:
        return [r.record for r in self._read_span(transaction_id, max_records)]

    def read_record_headers(self, transaction_id: int, max_records: int) -> list[RecordHeader]:
        return [r.record.record_header() for r in self._read_span(transaction_id, max_records)]

    def checksum(self, crc: int) -> int:
        """Continue an unsigned running CRC-32 over the data after the header (replica compare)."""
        assert self.files_open
        offset = HEADER_SIZE_BYTES
        chunk_bytes = 1 << 20
        while chunk := os.pread(self._seg_fd, chunk_bytes, offset):
            crc = zlib.crc32(chunk, crc)
            offset += len(chunk)
        return crc

    # --- file handles --------------------------------------------------------------------

    def ensure_open(self) -> None:
        """Reopen the files of a sealed segment the LRU cache closed."""
        assert not self.closed
        if not self.files_open:
            seg_fd = os.open(self.seg_path, os.O_RDWR)
            try:
                self._idx_fd = os.open(self.idx_path, os.O_RDWR)
            except BaseException:
                os.close(seg_fd)
                raise
            self._seg_fd = seg_fd

    def close_files(self) -> None:
        """Close the descriptors but keep the segment usable (``ensure_open`` reopens)."""
        if self.files_open:
            os.close(self._idx_fd)
            os.close(self._seg_fd)
            self._idx_fd = self._seg_fd = _NO_FD

    def close(self) -> None:
        if self.files_open and self.writable:
            self.flush()
        self.close_files()
        self.closed = True
        self.writable = False

    def delete(self) -> None:
        """Close and remove both files, data first as the original (partition open removes an
        index left behind by a crash in between)."""
        self.close()
        self.seg_path.unlink(missing_ok=True)
        self.idx_path.unlink(missing_ok=True)
