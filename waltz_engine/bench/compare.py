"""Compare two saved benchmark reports (any `waltz bench ... --json` output): new / old per figure.

Reports are flattened to numeric leaves named by their path; an item of a list is named by its
text fields when it has any (``results[zlib.crc32].mb_per_s``), else by its position, so the
same figure is found in both reports even when lists are ordered differently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from waltz_engine.common.errors import WaltzError

# What describes the run rather than measures it.
IGNORED_KEYS = frozenset({"machine"})


class CompareError(WaltzError):
    pass


class Comparison(NamedTuple):
    metric: str
    old: float
    new: float

    @property
    def ratio(self) -> float | None:
        return None if self.old == 0 else self.new / self.old

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "old": self.old, "new": self.new, "ratio": self.ratio}


def _label(item: Any, index: int) -> str:
    if isinstance(item, dict):
        words = [str(v) for k, v in item.items() if isinstance(v, str) or k in ("batch", "input_bytes")]
        if words:
            return ",".join(words)
    return str(index)


def flatten(report: Any, prefix: str = "") -> dict[str, float]:
    """Every numeric leaf of ``report`` by its path (booleans and text are not figures)."""
    leaves: dict[str, float] = {}
    if isinstance(report, dict):
        for key, value in report.items():
            if key not in IGNORED_KEYS:
                leaves.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(report, list):
        for index, item in enumerate(report):
            leaves.update(flatten(item, f"{prefix}[{_label(item, index)}]"))
    elif isinstance(report, int | float) and not isinstance(report, bool):
        leaves[prefix] = float(report)
    return leaves


def load_report(path: Path) -> Any:
    """A saved report: a JSON object with at least one figure (what `waltz bench ... --json` prints)."""
    hint = "save one with `waltz bench ... --json > FILE`"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CompareError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CompareError(f"{path} is not a saved benchmark report (not text; {hint})") from None
    except json.JSONDecodeError as e:
        raise CompareError(f"{path} is not a saved benchmark report (not JSON: {e}; {hint})") from None
    if not isinstance(report, dict):
        kind = type(report).__name__ if report is not None else "null"
        raise CompareError(f"{path} is not a saved benchmark report (JSON {kind}, not an object; {hint})")
    if not flatten(report):
        raise CompareError(f"{path} is not a saved benchmark report (it holds no figure; {hint})")
    return report


def compare(old: Any, new: Any) -> list[Comparison]:
    """The figures both reports have, in the new report's order."""
    old_leaves, new_leaves = flatten(old), flatten(new)
    common = [Comparison(m, old_leaves[m], v) for m, v in new_leaves.items() if m in old_leaves]
    if not common:
        raise CompareError("the two reports have no figure in common (are they from the same benchmark?)")
    return common
