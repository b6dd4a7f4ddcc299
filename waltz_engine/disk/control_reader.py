"""A read-only view of a storage node's control file ``waltz-storage.ctl`` (reference §1.4).

Unlike the storage node (and the Java ``DiskCli``), this never locks, creates or rewrites the
file, so it can look at the directory of a running node. Damage is described, not raised:
only a file that is not a control file at all is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from waltz_engine.common.errors import FormatError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES, ControlFileHeader
from waltz_engine.disk.partition_info import (
    PARTITION_INFO_SIZE_BYTES,
    DecodedPartitionInfo,
    PartitionInfoStruct,
    decode_record,
    partition_info_offset,
)

CONTROL_FILE_NAME = "waltz-storage.ctl"
SEGMENT_FILE_SUFFIXES = (".seg", ".idx")


@dataclass(frozen=True)
class PartitionView:
    """One partition's 76-byte record; ``problems`` is empty when both structs are sound."""

    partition_id: int
    info: DecodedPartitionInfo
    # 1 or 2; None when no struct can be current (the node refuses to start then).
    current_index: int | None
    problems: tuple[str, ...]

    @property
    def current(self) -> PartitionInfoStruct | None:
        if self.current_index is None:
            return None
        return (self.info.struct1 if self.current_index == 1 else self.info.struct2).value

    @property
    def corrupted(self) -> bool:
        return self.current_index is None


@dataclass(frozen=True)
class ControlFileView:
    path: Path
    size_bytes: int
    header: ControlFileHeader
    # Only the partitions whose whole record is in the file; see ``problems`` for the rest.
    partitions: tuple[PartitionView, ...]
    problems: tuple[str, ...]


def require_exists(path: Path) -> None:
    """One clear error for a path that is not there, before anything tries to interpret it."""
    if not path.exists():
        raise FormatError(f"{path}: no such file or directory")


def locate_control_file(path: Path) -> Path:
    """``path`` itself, or the control file inside ``path`` when it is a storage directory."""
    require_exists(path)
    if path.is_dir():
        candidate = path / CONTROL_FILE_NAME
        if not candidate.is_file():
            inside = sorted(str(c.parent) for c in path.glob(f"*/{CONTROL_FILE_NAME}"))
            where = f"; the storage directory is {', '.join(inside)}" if inside else ""
            raise FormatError(f"{path}: not a storage directory (it has no {CONTROL_FILE_NAME}){where}")
        return candidate
    if path.suffix in SEGMENT_FILE_SUFFIXES:
        raise FormatError(f"{path}: this is a segment file, not a control file (see `waltz inspect segment`)")
    return path


def read_control_file(path: Path) -> ControlFileView:
    """Decode a control file (or the one in a storage directory) without changing it."""
    path = locate_control_file(path)
    with path.open("rb") as f:
        content = f.read()
    if len(content) < HEADER_SIZE_BYTES:
        raise FormatError(
            f"{path}: not a control file: {len(content)} bytes, "
            f"shorter than the {HEADER_SIZE_BYTES}-byte header"
        )
    try:
        header = ControlFileHeader.from_bytes(content)
    except FormatError as e:
        raise FormatError(f"{path}: not a control file: {e}") from e

    problems: list[str] = []
    whole = min(header.num_partitions, (len(content) - HEADER_SIZE_BYTES) // PARTITION_INFO_SIZE_BYTES)
    if whole < header.num_partitions:
        needed = partition_info_offset(header.num_partitions)
        problems.append(
            f"truncated: the header says {header.num_partitions} partitions, which take {needed} bytes, "
            f"but the file has {len(content)} (partitions {whole}..{header.num_partitions - 1} missing)"
        )
    partitions = tuple(_partition_view(content, p) for p in range(whole))
    return ControlFileView(path, len(content), header, partitions, tuple(problems))


def _partition_view(content: bytes, partition_id: int) -> PartitionView:
    info = decode_record(content, partition_info_offset(partition_id))
    problems: list[str] = []
    if info.partition_id != partition_id:
        problems.append(f"partition id field is {info.partition_id}, expected {partition_id}")
    current_index: int | None
    try:
        current_index = info.current_index
    except FormatError as e:
        # The codec's message already names the partition; keep only the why.
        current_index = None
        problems.append(str(e).removeprefix(f"partition {info.partition_id}: "))
    for number, decoded in ((1, info.struct1), (2, info.struct2)):
        if not decoded.valid and current_index is not None:
            problems.append(
                f"struct {number} fails its checksum (sequence number field "
                f"{decoded.value.sequence_number}); struct {current_index} is used instead"
            )
    return PartitionView(partition_id, info, current_index, tuple(problems))
