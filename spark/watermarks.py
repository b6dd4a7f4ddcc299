"""Export watermarks: the highest txid an incremental export has durably written, per partition.

Two homes, one meaning:

* the output directory's ``_waltz_export/watermarks.json`` — the export's own durable state,
  replaced atomically after the data of a run is committed (see :mod:`spark.commit`); this
  module;
* ZooKeeper ``<cluster.root>/exports/<export-id>`` — published after that, so retention can
  keep every segment an export still needs. Its codec is the engine's
  (:mod:`waltz_engine.zk.export_watermarks`), shared with the storage nodes' cleaners.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from waltz_engine.common.errors import FormatError
from waltz_engine.common.fileio import fsync_directory
from waltz_engine.zk.export_watermarks import Watermarks
from waltz_engine.zk.java_io import INT32_MAX

STATE_DIR_NAME = "_waltz_export"  # leading "_": Spark and pyarrow datasets skip it when reading
WATERMARKS_FILE_NAME = "watermarks.json"
WATERMARKS_FILE_VERSION = 1


# --- the output directory --------------------------------------------------------------------


def state_dir(output: Path) -> Path:
    return output / STATE_DIR_NAME


def load_file_watermarks(output: Path) -> Watermarks:
    """The output's durable watermarks; empty when nothing was ever committed there."""
    path = state_dir(output) / WATERMARKS_FILE_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON: {e}") from None
    return {int(p): int(t) for p, t in raw["watermarks"].items()}


def write_json_atomically(path: Path, value: object) -> None:
    """Write, fsync, rename over, fsync the directory: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def save_file_watermarks(output: Path, watermarks: Mapping[int, int]) -> None:
    assert all(0 <= p <= INT32_MAX for p in watermarks)
    write_json_atomically(
        state_dir(output) / WATERMARKS_FILE_NAME,
        {
            "version": WATERMARKS_FILE_VERSION,
            "watermarks": {str(p): t for p, t in sorted(watermarks.items())},
        },
    )
