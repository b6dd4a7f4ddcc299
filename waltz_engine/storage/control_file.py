"""The control file ``waltz-storage.ctl``: cluster identity and per-partition session state.

Layout (reference §1.4) is in ``waltz_engine.disk.file_header`` and
``waltz_engine.disk.partition_info``; this module adds the read-write rules: create or
verify on open, lock the header against other processes, and update a partition by
writing the *other* struct with the next sequence number and syncing, so a torn write
leaves the previous struct current.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from waltz_engine.common.errors import FormatError, StorageError
from waltz_engine.common.fileio import DiskFile, pread_upto, pwrite_all
from waltz_engine.disk.file_header import FORMAT_VERSION, HEADER_SIZE_BYTES, ControlFileHeader
from waltz_engine.disk.partition_info import (
    FLAG_AVAILABLE,
    PARTITION_INFO_SIZE_BYTES,
    STRUCT1_OFFSET,
    STRUCT2_OFFSET,
    PartitionInfoStruct,
    decode_record,
    encode_record,
    initial_structs,
    partition_info_offset,
)
from waltz_engine.storage.constants import now_ms
from waltz_engine.storage.file_system import CLOSED_FILE, OS_DISK, Disk

# Java's AtomicInteger sequence number; wrapping would make the older struct look newer.
_MAX_SEQUENCE_NUMBER = 2**31 - 1
_STRUCT_OFFSETS = (STRUCT1_OFFSET, STRUCT2_OFFSET)


class ConcurrentUpdateError(StorageError):
    """A request carries an older session id than the one stored (Java ConcurrentUpdateException)."""


class SessionInfo(NamedTuple):
    """What LAST_SESSION_INFO answers: the current struct's session and low-water marks."""

    session_id: int
    low_water_mark: int
    local_low_water_mark: int


class PartitionInfo:
    """One partition's two alternating structs; every update writes the non-current one.

    Thread-safe: updates of one partition serialize on its own lock.
    """

    def __init__(
        self, file: DiskFile, partition_id: int, structs: list[PartitionInfoStruct], current: int
    ) -> None:
        assert len(structs) == 2 and current in (0, 1)
        self.partition_id = partition_id
        self._file = file
        self._record_offset = partition_info_offset(partition_id)
        self._structs = structs
        self._current = current
        # As the original, the counter follows the current struct; reset() restarts it at 0.
        self._sequence_number = structs[current].sequence_number
        self._lock = threading.Lock()

    @property
    def current(self) -> PartitionInfoStruct:
        with self._lock:
            return self._structs[self._current]

    @property
    def is_assigned(self) -> bool:
        return self.current.assigned

    @property
    def is_available(self) -> bool:
        return self.current.available

    def last_session_info(self) -> SessionInfo:
        s = self.current
        return SessionInfo(s.session_id, s.low_water_mark, s.local_low_water_mark)

    def set_low_water_mark(self, session_id: int, low_water_mark: int, local_low_water_mark: int) -> None:
        """Persist a new session's marks; refuse an older session or decreasing marks."""
        with self._lock:
            s = self._structs[self._current]
            if s.session_id > session_id:
                raise ConcurrentUpdateError(
                    f"session id has changed to {s.session_id}, but low watermark request contains "
                    f"session id {session_id}"
                )
            if low_water_mark < s.low_water_mark:
                raise StorageError(
                    f"unable to set low watermark to value {low_water_mark} because it's less than "
                    f"current low watermark {s.low_water_mark}"
                )
            if local_low_water_mark < s.local_low_water_mark:
                raise StorageError(
                    f"unable to set local low watermark to value {local_low_water_mark} because it's "
                    f"less than current local low watermark {s.local_low_water_mark}"
                )
            self._write_next(session_id, low_water_mark, local_low_water_mark, s.flags)

    def set_flags(self, flags: int) -> None:
        with self._lock:
            s = self._structs[self._current]
            self._write_next(s.session_id, s.low_water_mark, s.local_low_water_mark, flags)

    def set_flag(self, flag: int, on: bool) -> None:
        with self._lock:
            s = self._structs[self._current]
            flags = s.flags | flag if on else s.flags & ~flag
            self._write_next(s.session_id, s.low_water_mark, s.local_low_water_mark, flags)

    def reset(self) -> None:
        """Back to a formatted partition: marks -1, available, not assigned (unassignment).

        As the original's ``reset()``: the current struct gets sequence number -1, the other 0,
        and the counter restarts at 0; both are written with one write and synced.
        """
        with self._lock:
            fresh = [PartitionInfoStruct(-1, -1, -1, FLAG_AVAILABLE, -1)] * 2
            fresh[1 - self._current] = fresh[1 - self._current]._replace(sequence_number=0)
            record = encode_record(self.partition_id, fresh[0], fresh[1])
            pwrite_all(self._file, memoryview(record)[STRUCT1_OFFSET:], self._record_offset + STRUCT1_OFFSET)
            self._file.fdatasync()
            self._structs = fresh
            self._sequence_number = 0

    def _write_next(
        self, session_id: int, low_water_mark: int, local_low_water_mark: int, flags: int
    ) -> None:
        assert self._sequence_number < _MAX_SEQUENCE_NUMBER, "control struct sequence number overflow"
        sequence_number = self._sequence_number + 1
        target = 1 - self._current
        new = PartitionInfoStruct(session_id, low_water_mark, local_low_water_mark, flags, sequence_number)
        pwrite_all(self._file, new.to_bytes(), self._record_offset + _STRUCT_OFFSETS[target])
        self._file.fdatasync()
        # Only a synced struct becomes current: if the write failed, the old one still is.
        self._structs[target] = new
        self._current = target
        self._sequence_number = sequence_number


class ControlFile:
    """An open, locked control file. Close it (or use ``with``) to release the lock."""

    def __init__(
        self, path: Path, file: DiskFile, header: ControlFileHeader, infos: list[PartitionInfo]
    ) -> None:
        self.path = path
        self.header = header
        self._file = file
        self._infos = infos

    @classmethod
    def open(
        cls,
        path: Path,
        key: uuid.UUID,
        num_partitions: int,
        *,
        clock_ms: Callable[[], int] = now_ms,
        disk: Disk = OS_DISK,
        read_only: bool = False,
    ) -> ControlFile:
        """Create the file when shorter than a header, else verify key and partition count.

        ``read_only`` (with a read-only ``disk``): a file shorter than a header is refused."""
        assert num_partitions >= 0
        file = disk.open_locked(path)
        try:
            if read_only and file.size_bytes() < HEADER_SIZE_BYTES:
                raise StorageError(
                    f"{path}: the control file is shorter than its header ({file.size_bytes()} bytes): "
                    "not a formatted storage directory"
                )
            return cls._load(path, file, key, num_partitions, clock_ms)
        except BaseException:
            file.close()
            raise

    @classmethod
    def _load(
        cls, path: Path, file: DiskFile, key: uuid.UUID, num_partitions: int, clock_ms: Callable[[], int]
    ) -> ControlFile:
        size_bytes = file.size_bytes()
        if size_bytes < HEADER_SIZE_BYTES:
            header = ControlFileHeader(FORMAT_VERSION, clock_ms(), key, num_partitions)
            struct1, struct2 = initial_structs()
            body = b"".join(encode_record(p, struct1, struct2) for p in range(num_partitions))
            pwrite_all(file, header.to_bytes() + body, 0)
            file.fsync()
        else:
            header = ControlFileHeader.from_bytes(pread_upto(file, HEADER_SIZE_BYTES, 0))
            if header.key != key:
                raise StorageError(
                    f"{path}: the cluster key does not match (file has {header.key}, expected {key})"
                )
            if header.num_partitions != num_partitions:
                raise StorageError(
                    f"{path}: the number of partitions does not match "
                    f"(file has {header.num_partitions}, expected {num_partitions})"
                )
        return cls(path, file, header, cls._read_infos(path, file, header.num_partitions))

    @staticmethod
    def _read_infos(path: Path, file: DiskFile, num_partitions: int) -> list[PartitionInfo]:
        expected_bytes = HEADER_SIZE_BYTES + PARTITION_INFO_SIZE_BYTES * num_partitions
        body = pread_upto(file, expected_bytes - HEADER_SIZE_BYTES, HEADER_SIZE_BYTES)
        if HEADER_SIZE_BYTES + len(body) < expected_bytes:
            raise FormatError(
                f"{path}: control file is truncated ({HEADER_SIZE_BYTES + len(body)} of "
                f"{expected_bytes} bytes)"
            )
        infos = []
        for partition_id in range(num_partitions):
            decoded = decode_record(body, PARTITION_INFO_SIZE_BYTES * partition_id)
            if decoded.partition_id != partition_id:
                raise FormatError(
                    f"{path}: the partition id does not match (record {partition_id} holds "
                    f"{decoded.partition_id})"
                )
            try:
                current = decoded.current_index - 1
            except FormatError as e:  # "partition info corrupted": neither struct is valid
                raise FormatError(f"{path}: {e}") from e
            structs = [decoded.struct1.value, decoded.struct2.value]
            infos.append(PartitionInfo(file, partition_id, structs, current))
        return infos

    @property
    def key(self) -> uuid.UUID:
        return self.header.key

    @property
    def num_partitions(self) -> int:
        return self.header.num_partitions

    def partition_info(self, partition_id: int) -> PartitionInfo:
        if not 0 <= partition_id < len(self._infos):
            raise StorageError(
                f"partition {partition_id} is out of range (the cluster has {len(self._infos)} partitions)"
            )
        return self._infos[partition_id]

    def close(self) -> None:
        file, self._file = self._file, CLOSED_FILE
        if file is not CLOSED_FILE:
            file.fsync()
            file.close()

    def __enter__(self) -> ControlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
