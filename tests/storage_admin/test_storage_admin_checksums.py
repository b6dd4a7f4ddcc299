"""Replica checksums (the original's ``WaltzStorage.checksums``) on directories made in-process."""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path

import pytest
from storage_node_support import make_records

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.errors import StorageError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.storage import StorageManager
from waltz_engine.storage.admin_ops import StorageAdminError, replica_checksums

KEY = uuid.UUID(int=0x5A17)
NUM_PARTITIONS = 3


def _storage(directory: Path, count: int) -> Path:
    directory.mkdir()
    with StorageManager(directory, KEY, NUM_PARTITIONS) as manager:
        manager.set_partition_assignment([0, 2], True)
        manager.partition(0).append(make_records(0, count))
    return directory


def test_equal_copies_have_equal_checksums_and_a_difference_shows(tmp_path: Path) -> None:
    one, two, longer = (_storage(tmp_path / name, n) for name, n in (("one", 40), ("two", 40), ("long", 41)))
    sums = replica_checksums(one, KEY, NUM_PARTITIONS).checksums
    assert sorted(sums) == [0, 2]  # every assigned partition by default
    assert sums == replica_checksums(two, KEY, NUM_PARTITIONS).checksums
    assert replica_checksums(longer, KEY, NUM_PARTITIONS, [0]).checksums[0] != sums[0]
    assert sums[2] == 0  # an empty partition: CRC-32 of no bytes

    # The CRC covers exactly the segment bytes after the 128-byte header (Segment.checksum).
    segment = (one / "0" / "0000000000000000000.seg").read_bytes()
    assert sums[0] == to_signed32(zlib.crc32(segment[HEADER_SIZE_BYTES:]))


def test_checksums_refuse_unassigned_partitions_and_foreign_keys(tmp_path: Path) -> None:
    directory = _storage(tmp_path / "s", 3)
    with pytest.raises(StorageAdminError, match="partition 1 is not assigned"):
        replica_checksums(directory, KEY, NUM_PARTITIONS, [0, 1])
    with pytest.raises(StorageError, match="cluster key does not match"):
        replica_checksums(directory, uuid.UUID(int=1), NUM_PARTITIONS)
