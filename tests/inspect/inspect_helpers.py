"""Shared by the `waltz inspect` tests: running the CLI, copying and building storage files."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from waltz_cli.main import app
from waltz_engine.common.crc import crc32
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.file_header import SegmentFileHeader
from waltz_engine.disk.record_format import encode_records

KEY = uuid.UUID("dad1ea14-6351-4aca-a2fd-ba73d70294b2")


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["inspect", *map(str, args)])


def run_json(*args: str | Path) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def copy_storage(vectors: Path, name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(vectors / "disk" / name / "storage", target)
    return target


def segments_of(storage: Path) -> list[Path]:
    return sorted(storage.glob("*/*.seg"))


def make_record(txid: int, data: bytes, partition: int = 0) -> Record:
    return Record(txid, ReqId(7, 1, partition, txid + 2), txid, data, crc32(data))


def write_segment(
    directory: Path, first_txid: int, payloads: list[bytes], partition: int = 0, key: uuid.UUID = KEY
) -> Path:
    """A well-formed segment pair, like the storage node writes it."""
    header = SegmentFileHeader(0, 1_700_000_000_000, key, partition, first_txid).to_bytes()
    records = [make_record(first_txid + i, p, partition) for i, p in enumerate(payloads)]
    data, index = encode_records(records, len(header))
    directory.mkdir(parents=True, exist_ok=True)
    seg = directory / f"{first_txid:019d}.seg"
    seg.write_bytes(header + data)
    seg.with_suffix(".idx").write_bytes(header + index)
    return seg
