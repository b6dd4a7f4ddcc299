"""Read-only inspection of a storage node's files: the library behind ``waltz inspect``.

Every function here only reads (see :mod:`waltz_engine.disk.segment_reader`): it never
truncates, rewrites or locks, so it is safe on a damaged copy and next to a running node.
Results are plain JSON-ready dicts (``inspect_control``, ``inspect_segment``) or small
dataclasses with ``to_json()`` (``verify``, ``segment_stats``). Damage is part of the result;
only input that is not a storage file at all raises :class:`~waltz_engine.common.errors.WaltzError`.
"""

from __future__ import annotations

import json
import statistics
import uuid
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from waltz_engine.common.decoder import Decoder, try_decode
from waltz_engine.common.errors import FormatError, WaltzError
from waltz_engine.disk.control_reader import (
    CONTROL_FILE_NAME,
    ControlFileView,
    PartitionView,
    read_control_file,
    require_exists,
)
from waltz_engine.disk.file_header import SegmentFileHeader
from waltz_engine.disk.partition_info import DecodedStruct
from waltz_engine.disk.segment_reader import (
    INDEX_SUFFIX,
    KIND_HEADER,
    SEGMENT_SUFFIX,
    SegmentProblem,
    SegmentReader,
    SegmentRecord,
)
from waltz_engine.storage.partition_files import local_usage

_PRINTABLE_FIRST, _PRINTABLE_LAST = 0x20, 0x7E
# Problem kinds found above the level of one segment.
KIND_CONTROL = "control-file"
KIND_PARTITION = "control-partition"
KIND_SEGMENT_GAP = "segment-gap"
KIND_LOW_WATER_MARK = "low-water-mark"
KIND_ORPHAN_INDEX = "orphan-index"


def printable_text(data: bytes) -> str:
    """ASCII as is, every other byte as '.', like the right-hand side of a hex dump."""
    return "".join(chr(b) if _PRINTABLE_FIRST <= b <= _PRINTABLE_LAST else "." for b in data)


# ---------------------------------------------------------------------------------- control


def inspect_control(path: Path | str, partition: int | None = None) -> dict[str, Any]:
    """The control file (or the one in a storage directory) as a JSON-ready dict.

    A partition whose two structs both fail their checksum is listed with
    ``"corrupted": true`` and null values; the other partitions are unaffected.
    """
    view = read_control_file(Path(path))
    partitions = view.partitions
    if partition is not None:
        if not 0 <= partition < len(partitions):
            raise WaltzError(f"{view.path}: no partition {partition} (it has {len(partitions)})")
        partitions = (partitions[partition],)
    return {
        "path": str(view.path),
        "version": view.header.version,
        "creation_time": view.header.creation_time_ms,
        "key": str(view.header.key),
        "num_partitions": view.header.num_partitions,
        "partitions": [_partition_json(p, view.path.parent / str(p.partition_id)) for p in partitions],
        "problems": list(view.problems),
    }


def _partition_json(view: PartitionView, directory: Path) -> dict[str, Any]:
    current = view.current
    # The segments on this disk (a node with a tier holds the evicted ones in its object store).
    local_segments, local_bytes = local_usage(directory) if directory.is_dir() else (0, 0)
    return {
        "partition_id": view.partition_id,
        "local_segments": local_segments,
        "local_bytes": local_bytes,
        "session_id": current.session_id if current else None,
        "low_water_mark": current.low_water_mark if current else None,
        "local_low_water_mark": current.local_low_water_mark if current else None,
        "flags": current.flags if current else None,
        "assigned": current.assigned if current else None,
        "available": current.available if current else None,
        "sequence_number": current.sequence_number if current else None,
        "current_struct": view.current_index,
        "struct1_valid": view.info.struct1.valid,
        "struct2_valid": view.info.struct2.valid,
        "corrupted": view.corrupted,
        "partition_id_field": view.info.partition_id,
        "struct1": _struct_json(view.info.struct1),
        "struct2": _struct_json(view.info.struct2),
        "problems": list(view.problems),
    }


def _struct_json(decoded: DecodedStruct) -> dict[str, Any]:
    return {**decoded.value._asdict(), "checksum": decoded.stored_checksum, "valid": decoded.valid}


# ---------------------------------------------------------------------------------- segment


def inspect_segment(
    path: Path | str,
    transaction: int | None = None,
    limit: int | None = None,
    decoder: Decoder | None = None,
) -> dict[str, Any]:
    """A segment's headers, records (in file order) and problems as a JSON-ready dict.

    ``transaction`` starts at that txid (found through the index when it has it) and, without
    ``limit``, keeps only it; ``limit`` stops after that many records (``--transaction 60 --max
    3``: 60, 61 and 62). ``decoder`` turns each record's data into something to show; if it
    raises, the record gets a ``decode_error`` instead.
    """
    assert limit is None or limit >= 0
    if transaction is not None and limit is None:
        limit = 1
    with SegmentReader(Path(path)) as reader:
        records: list[dict[str, Any]] = []
        problems = [_problem_json(p) for p in reader.header_problems]
        for item in reader.scan(start_transaction_id=transaction):
            if limit is not None and len(records) >= limit:
                break
            txid = (
                item.record.record.transaction_id if isinstance(item, SegmentRecord) else item.transaction_id
            )
            if transaction is not None and (txid is None or txid < transaction):
                continue
            if transaction is not None and not records and txid != transaction:
                break  # the segment has no record ``transaction``
            if isinstance(item, SegmentRecord):
                records.append(_record_json(item, decoder))
            else:
                problems.append(_problem_json(item))
        if (
            transaction is not None
            and not records
            and not any(p["transaction_id"] == transaction for p in problems)
        ):
            raise WaltzError(f"{reader.path}: no record for txid {transaction} in this segment")
        return {
            "path": str(reader.path),
            "header": _header_json(reader.header),
            "index_header": _header_json(reader.index_header) if reader.index_header else None,
            "data_size_bytes": reader.data_size_bytes,
            "index_entries": reader.index_entry_count,
            "records": records,
            "problems": problems,
        }


def _header_json(header: SegmentFileHeader) -> dict[str, Any]:
    return {
        "version": header.version,
        "creation_time": header.creation_time_ms,
        "key": str(header.key),
        "partition_id": header.partition_id,
        "first_transaction_id": header.first_transaction_id,
    }


def _record_json(item: SegmentRecord, decoder: Decoder | None) -> dict[str, Any]:
    disk = item.record
    record = disk.record
    result: dict[str, Any] = {
        "transaction_id": record.transaction_id,
        "offset": disk.offset,
        **record.req_id.to_json(),
        "header": record.header,
        "data_size": len(record.data),
        "data_hex": record.data.hex(),
        "data_text": printable_text(record.data),
        "checksum": record.checksum,
        "checksum_ok": disk.checksum_ok,
        "record_checksum": disk.record_checksum,
        "record_checksum_ok": disk.record_checksum_ok,
        "index_ok": item.index_ok,
    }
    if decoder is not None:
        decoded, error = try_decode(decoder, record.data)
        if error is None:
            result["decoded"] = _json_ready(decoded)
        else:
            result["decode_error"] = error
    return result


def _json_ready(value: object) -> object:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _problem_json(problem: SegmentProblem) -> dict[str, Any]:
    return asdict(problem)


# ----------------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class Problem:
    """One thing that failed, with the file it is in (relative to what was verified)."""

    file: str
    kind: str
    message: str
    transaction_id: int | None = None
    partition_id: int | None = None

    def __str__(self) -> str:
        where = f" txid {self.transaction_id}:" if self.transaction_id is not None else ""
        return f"{self.file}:{where} {self.message}"


@dataclass
class VerifyReport:
    path: str
    control_files: int = 0
    segments: int = 0
    records: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        checked = (
            f"{self.control_files} control file(s), {self.segments} segment(s), {self.records} record(s)"
        )
        verdict = "all checks pass" if self.ok else f"{len(self.problems)} problem(s)"
        return f"checked {checked}: {verdict}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "control_files": self.control_files,
            "segments": self.segments,
            "records": self.records,
            "problems": [asdict(p) for p in self.problems],
        }


def verify(path: Path | str) -> VerifyReport:
    """Check a storage directory, a control file, or one segment; collect every problem.

    A directory is checked as a whole: control file structs, then every segment of every
    partition directory (headers against file names, partition and cluster key; index
    against data; both checksums of every record; segments contiguous; the local
    low-water mark covered by the data).
    """
    path = Path(path)
    require_exists(path)
    report = VerifyReport(str(path))
    if path.is_dir():
        _verify_directory(path, report)
    elif path.name == CONTROL_FILE_NAME:
        _verify_control(read_control_file(path), report, path.name)
    else:
        # Unlike a segment inside a directory, a lone file that is no segment is an input error.
        with SegmentReader(path) as reader:
            context = _context_of_segment(reader.path)
            _verify_segment(reader, report, str(reader.path), context.partition_id, context.key)
    return report


@dataclass(frozen=True)
class _SegmentContext:
    partition_id: int | None
    key: uuid.UUID | None


def _context_of_segment(path: Path) -> _SegmentContext:
    """What a lone segment's location says it should hold: its directory's partition, the key."""
    parent = path.resolve().parent
    partition_id = int(parent.name) if parent.name.isdigit() else None
    try:
        key: uuid.UUID | None = read_control_file(parent.parent).header.key
    except (WaltzError, OSError):
        key = None  # no readable control file next to it: nothing to compare with
    return _SegmentContext(partition_id, key)


def _verify_control(view: ControlFileView, report: VerifyReport, name: str) -> None:
    report.control_files += 1
    report.problems.extend(Problem(name, KIND_CONTROL, message) for message in view.problems)
    for p in view.partitions:
        report.problems.extend(
            Problem(
                name, KIND_PARTITION, f"partition {p.partition_id}: {message}", partition_id=p.partition_id
            )
            for message in p.problems
        )


def _verify_directory(root: Path, report: VerifyReport) -> None:
    view = read_control_file(root)
    _verify_control(view, report, view.path.name)
    directories = dict(_partition_directories(root))
    # A partition with committed data must have a directory even if it is gone.
    with_data = {p.partition_id for p in view.partitions if p.current and p.current.local_low_water_mark >= 0}
    for partition_id in sorted(directories.keys() | with_data):
        directory = directories.get(partition_id, root / str(partition_id))
        rel = str(directory.relative_to(root))
        control = view.partitions[partition_id] if partition_id < len(view.partitions) else None
        if control is None:
            report.problems.append(
                Problem(
                    rel,
                    KIND_PARTITION,
                    f"directory of partition {partition_id}, which the control file does not have "
                    f"({view.header.num_partitions} partitions)",
                    partition_id=partition_id,
                )
            )
        last = _verify_partition_directory(root, directory, partition_id, view.header.key, report)
        current = control.current if control else None
        if current is not None and current.local_low_water_mark > last:
            report.problems.append(
                Problem(
                    rel,
                    KIND_LOW_WATER_MARK,
                    f"partition {partition_id}: local low-water mark {current.local_low_water_mark} "
                    + (
                        f"but the data ends at txid {last}"
                        if directory.is_dir()
                        else "but the directory is missing"
                    ),
                    partition_id=partition_id,
                )
            )


def _verify_partition_directory(
    root: Path, directory: Path, partition_id: int, key: uuid.UUID, report: VerifyReport
) -> int:
    """Check every segment of a partition and that they follow each other; the last txid, or -1."""
    for orphan in sorted(directory.glob(f"*{INDEX_SUFFIX}")):
        if not orphan.with_suffix(SEGMENT_SUFFIX).exists():
            report.problems.append(
                Problem(str(orphan.relative_to(root)), KIND_ORPHAN_INDEX, "index without a data file")
            )
    next_txid: int | None = None
    for segment in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
        name = str(segment.relative_to(root))
        try:
            reader = SegmentReader(segment)
        except WaltzError as e:
            report.problems.append(Problem(name, KIND_HEADER, str(e), partition_id=partition_id))
            continue
        with reader:
            first, end = _verify_segment(reader, report, name, partition_id, key)
        if next_txid is not None and first != next_txid:
            report.problems.append(
                Problem(
                    name,
                    KIND_SEGMENT_GAP,
                    f"starts at txid {first} but the previous segment ends before txid {next_txid}",
                    partition_id=partition_id,
                )
            )
        next_txid = end
    return -1 if next_txid is None else next_txid - 1


def _partition_directories(root: Path) -> list[tuple[int, Path]]:
    found = [(int(d.name), d) for d in root.iterdir() if d.is_dir() and d.name.isdigit()]
    return sorted(found)


def _verify_segment(
    reader: SegmentReader, report: VerifyReport, name: str, partition_id: int | None, key: uuid.UUID | None
) -> tuple[int, int]:
    """Check one segment into ``report``; its first txid and one past its last whole record."""
    report.segments += 1
    header = reader.header

    def problem(kind: str, message: str, txid: int | None = None) -> None:
        report.problems.append(Problem(name, kind, message, txid, header.partition_id))

    for p in reader.header_problems:
        problem(p.kind, p.message)
    if partition_id is not None and header.partition_id != partition_id:
        problem(KIND_HEADER, f"header says partition {header.partition_id}, the directory {partition_id}")
    if key is not None and header.key != key:
        problem(KIND_HEADER, f"header has cluster key {header.key}, the control file {key}")
    end = header.first_transaction_id
    for item in reader.scan():
        if isinstance(item, SegmentRecord):
            report.records += 1
            end += 1
        else:
            problem(item.kind, item.message, item.transaction_id)
    return header.first_transaction_id, end


# ------------------------------------------------------------------------------------ stats


@dataclass(frozen=True)
class SegmentStats:
    """Data sizes of a segment's whole records; min/max/mean/median are None when empty."""

    file: str
    partition_id: int
    first_transaction_id: int
    record_count: int
    total_data_bytes: int
    min_data_bytes: int | None
    max_data_bytes: int | None
    mean_data_bytes: float | None
    median_data_bytes: float | None
    problem_count: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def segment_stats(path: Path | str) -> list[SegmentStats]:
    """One row per segment: ``path`` is a segment, a partition directory or a storage directory."""
    path = Path(path)
    require_exists(path)
    return [_stats_of(segment, path) for segment in _segments_under(path)]


def _segments_under(path: Path) -> Iterator[Path]:
    if not path.is_dir():
        yield path
        return
    found = sorted(path.glob(f"*{SEGMENT_SUFFIX}"))
    for _, directory in _partition_directories(path):
        found.extend(sorted(directory.glob(f"*{SEGMENT_SUFFIX}")))
    if not found:
        raise FormatError(f"{path}: no {SEGMENT_SUFFIX} files in it or in its partition directories")
    yield from found


def _stats_of(segment: Path, root: Path) -> SegmentStats:
    sizes = array("q")
    problem_count = 0
    with SegmentReader(segment) as reader:
        problem_count += len(reader.header_problems)
        for item in reader.scan():
            if isinstance(item, SegmentRecord):
                sizes.append(len(item.record.record.data))
            else:
                problem_count += 1
        header = reader.header
    name = str(segment.relative_to(root)) if root.is_dir() else str(segment)
    empty = len(sizes) == 0
    return SegmentStats(
        file=name,
        partition_id=header.partition_id,
        first_transaction_id=header.first_transaction_id,
        record_count=len(sizes),
        total_data_bytes=sum(sizes),
        min_data_bytes=None if empty else min(sizes),
        max_data_bytes=None if empty else max(sizes),
        mean_data_bytes=None if empty else statistics.fmean(sizes),
        median_data_bytes=None if empty else float(statistics.median(sizes)),
        problem_count=problem_count,
    )
