"""What a partition knows is damaged on its disk (issue 13, item 2).

Damage is found when a segment is opened (the same bounded window start-up recovery looks at)
or when a read meets a record that fails its checks. It is never repaired in place by the
node itself: the bytes stay as they are, the damaged records are refused on every read (the
server reads them from another replica), and the partition reports what it found (log,
``/health``, ``waltz storage list``) until a refill from a healthy replica replaces the
segment (``waltz storage recover-partition``, see ``refill.py``).

Thread-safe: the partition's disk thread records damage while the event loop reads reports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Problems listed per segment (their text); more are counted.
MAX_PROBLEMS_PER_SEGMENT = 8
# The per-partition metrics gauge listing the damaged segments (``SegmentDamage.to_json``).
DAMAGE_GAUGE = "damaged-segments"


class Damage(NamedTuple):
    """One thing wrong in a segment: records (a txid range) or the files themselves (no range)."""

    what: str
    first_transaction_id: int | None = None
    last_transaction_id: int | None = None


def transaction_ranges(transaction_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted txids as inclusive ranges: [3, 4, 5, 9] → [(3, 5), (9, 9)]."""
    ranges: list[tuple[int, int]] = []
    for txid in sorted(set(transaction_ids)):
        if ranges and ranges[-1][1] + 1 == txid:
            ranges[-1] = (ranges[-1][0], txid)
        else:
            ranges.append((txid, txid))
    return ranges


def format_ranges(ranges: Iterable[tuple[int, int]]) -> str:
    """[(3, 5), (9, 9)] → ``3-5, 9``."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


class SegmentDamage(NamedTuple):
    """A damaged segment as reported: its span, the records it cannot serve, what is wrong."""

    segment: int  # its first transaction id (the file name)
    max_transaction_id: int
    transactions: tuple[tuple[int, int], ...]
    problems: tuple[str, ...]

    def describe(self) -> str:
        records = f"transactions {format_ranges(self.transactions)}" if self.transactions else "no record"
        return f"segment {self.segment}-{self.max_transaction_id}: {records} ({'; '.join(self.problems)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "max_transaction_id": self.max_transaction_id,
            "transactions": [list(r) for r in self.transactions],
            "problems": list(self.problems),
        }

    @classmethod
    def from_json(cls, value: Any) -> SegmentDamage:
        """Parse what :meth:`to_json` wrote (the metrics gauge); ValueError when it is not that."""
        if not isinstance(value, dict):
            raise ValueError(f"not a damaged segment: {value!r}")
        try:
            transactions = tuple((int(a), int(b)) for a, b in value["transactions"])
            return cls(
                int(value["segment"]),
                int(value["max_transaction_id"]),
                transactions,
                tuple(str(p) for p in value["problems"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a damaged segment: {value!r} ({e})") from None


@dataclass
class _Entry:
    # What is wrong with each damaged record, and with the files themselves (headers, index).
    transactions: dict[int, str] = field(default_factory=dict)
    file_problems: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = list(self.file_problems)
        for what in self.transactions.values():
            if what not in found:
                found.append(what)
        if len(found) > MAX_PROBLEMS_PER_SEGMENT:
            more = len(found) - MAX_PROBLEMS_PER_SEGMENT
            found = [*found[:MAX_PROBLEMS_PER_SEGMENT], f"{more} more problems"]
        return found


class DamageLog:
    """Damage per segment (keyed by the segment's first txid) until the segment is refilled or cut."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._segments: dict[int, _Entry] = {}

    def add(self, segment: int, damages: Iterable[Damage]) -> None:
        with self._lock:
            for damage in damages:
                self._add(segment, damage)

    def _add(self, segment: int, damage: Damage) -> bool:
        entry = self._segments.setdefault(segment, _Entry())
        if damage.first_transaction_id is None:
            if damage.what in entry.file_problems:
                return False
            entry.file_problems.append(damage.what)
            return True
        last = damage.last_transaction_id
        assert last is not None and last >= damage.first_transaction_id
        before = len(entry.transactions)
        for txid in range(damage.first_transaction_id, last + 1):
            entry.transactions.setdefault(txid, damage.what)
        return len(entry.transactions) > before

    def found(self, segment: int, transaction_id: int, what: str) -> bool:
        """A read met a damaged record; True when it was not known yet (worth a log line)."""
        with self._lock:
            return self._add(segment, Damage(what, transaction_id, transaction_id))

    def forget_segment(self, segment: int) -> None:
        with self._lock:
            self._segments.pop(segment, None)

    def forget_after(self, transaction_id: int) -> None:
        """Records after ``transaction_id`` were cut (a truncate): their damage went with them."""
        with self._lock:
            for segment, entry in list(self._segments.items()):
                if segment > transaction_id:
                    del self._segments[segment]
                    continue
                entry.transactions = {t: w for t, w in entry.transactions.items() if t <= transaction_id}
                if not entry.transactions and not entry.file_problems:
                    del self._segments[segment]

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._segments)

    def report(self, max_transaction_id_of: Callable[[int], int]) -> list[SegmentDamage]:
        """Every damaged segment, oldest first; ``max_transaction_id_of(segment)`` gives its end."""
        with self._lock:
            snapshot = [(s, sorted(e.transactions), e.problems()) for s, e in sorted(self._segments.items())]
        return [
            SegmentDamage(
                segment,
                max_transaction_id_of(segment),
                tuple(transaction_ranges(transactions)),
                tuple(problems),
            )
            for segment, transactions, problems in snapshot
        ]
