"""Helpers shared by the storage engine tests (module name unique across the test tree)."""

from __future__ import annotations

import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES

# The cluster of the golden disk vectors (README §3/§4).
VECTOR_KEY = uuid.UUID("dad1ea14-6351-4aca-a2fd-ba73d70294b2")
VECTOR_NUM_PARTITIONS = 4
VECTOR_THRESHOLD_BYTES = 2048
# Creation time: 8 bytes at offset 4 of every 128-byte file header.
CREATION_TIME_SLICE = slice(4, 12)


def record_from_vector(line: dict[str, Any]) -> Record:
    r = line["reqId"]
    req_id = ReqId(r["clientId"], r["generation"], r["partitionId"], r["seqNum"])
    return Record(
        line["transactionId"], req_id, line["header"], bytes.fromhex(line["data_hex"]), line["checksum"]
    )


def without_creation_time(data: bytes) -> bytes:
    assert len(data) >= HEADER_SIZE_BYTES
    masked = bytearray(data)
    masked[CREATION_TIME_SLICE] = bytes(8)
    return bytes(masked)


def storage_files(directory: Path) -> dict[str, bytes]:
    """Every file under a storage directory by relative path."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def copy_writable(source: Path, target: Path) -> Path:
    """Copy a (read-only) vector directory and make the copy writable."""
    shutil.copytree(source, target)
    for p in [target, *target.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return target
