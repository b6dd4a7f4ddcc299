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

import bisect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Problems listed per segment (their text); more are counted.
MAX_PROBLEMS_PER_SEGMENT = 8
# Damaged txid ranges kept per segment; beyond it the closest ranges are joined.
MAX_DAMAGE_RANGES_PER_SEGMENT = 64
# The per-partition metrics gauge listing the damaged segments (``SegmentDamage.to_json``).
DAMAGE_GAUGE = "damaged-segments"


class Damage(NamedTuple):
    """One thing wrong in a segment: records (a txid range) or the files themselves (no range)."""

    what: str
    first_transaction_id: int | None = None
    last_transaction_id: int | None = None


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
    """A segment's damage: its damaged records as merged txid ranges (at most
    ``MAX_DAMAGE_RANGES_PER_SEGMENT``), what is wrong with them and with the files themselves."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    # What is wrong with the files themselves (headers, index), and with the damaged records:
    # distinct texts in the order found, at most ``MAX_PROBLEMS_PER_SEGMENT`` in all, then a count.
    file_problems: list[str] = field(default_factory=list)
    record_problems: list[str] = field(default_factory=list)
    more_problems: int = 0

    def add_text(self, what: str, texts: list[str]) -> bool:
        """Note a problem in ``texts``; True when it is new."""
        if what in self.file_problems or what in self.record_problems:
            return False
        if len(self.file_problems) + len(self.record_problems) < MAX_PROBLEMS_PER_SEGMENT:
            texts.append(what)
        else:
            self.more_problems += 1
        return True

    def add_range(self, first: int, last: int) -> bool:
        """Mark ``first`` .. ``last`` damaged; True when any of them was not known to be."""
        ranges = self.ranges
        i = bisect.bisect_left(ranges, (first, first))
        # An earlier range reaching ``first`` (or adjacent to it) is merged too.
        if i > 0 and ranges[i - 1][1] >= first - 1:
            i -= 1
        j = i
        low, high = first, last
        while j < len(ranges) and ranges[j][0] <= last + 1:
            low, high = min(low, ranges[j][0]), max(high, ranges[j][1])
            j += 1
        new = not (j == i + 1 and ranges[i][0] <= first and last <= ranges[i][1])
        ranges[i:j] = [(low, high)]
        while len(ranges) > MAX_DAMAGE_RANGES_PER_SEGMENT:
            # Too many: join the two closest ranges (the report names a few whole records too,
            # never fewer damaged ones; reads check every record themselves).
            k = min(range(len(ranges) - 1), key=lambda n: ranges[n + 1][0] - ranges[n][1])
            ranges[k : k + 2] = [(ranges[k][0], ranges[k + 1][1])]
        return new

    def forget_after(self, transaction_id: int) -> None:
        self.ranges = [(a, min(b, transaction_id)) for a, b in self.ranges if a <= transaction_id]
        if not self.ranges:
            self.record_problems.clear()

    def problems(self) -> list[str]:
        more = [f"{self.more_problems} more problems"] if self.more_problems else []
        return [*self.file_problems, *self.record_problems, *more]


class DamageLog:
    """Damage per segment (keyed by the segment's first txid) until the segment is refilled or cut.

    Memory and report size are bounded per segment whatever the damage: merged ranges, capped.
    """

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
            return entry.add_text(damage.what, entry.file_problems)
        last = damage.last_transaction_id
        assert last is not None and last >= damage.first_transaction_id
        entry.add_text(damage.what, entry.record_problems)
        return entry.add_range(damage.first_transaction_id, last)

    def add_found_on_read(self, segment: int, transaction_id: int, what: str) -> bool:
        """A read met a damaged record: record it. Returns whether it is newly known (worth a log line)."""
        with self._lock:
            return self._add(segment, Damage(what, transaction_id, transaction_id))

    def forget_segment(self, segment: int) -> None:
        with self._lock:
            self._segments.pop(segment, None)

    def forget_after(self, transaction_id: int) -> None:
        """Records after ``transaction_id`` were cut (a truncate): their damage went with them.
        What is wrong with the files stays listed while the segment has any damage."""
        with self._lock:
            for segment, entry in list(self._segments.items()):
                if segment > transaction_id:
                    del self._segments[segment]
                    continue
                entry.forget_after(transaction_id)
                if not entry.ranges and not entry.file_problems:
                    del self._segments[segment]

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._segments)

    def report(self, max_transaction_id_of: Callable[[int], int]) -> list[SegmentDamage]:
        """Every damaged segment, oldest first; ``max_transaction_id_of(segment)`` gives its end."""
        with self._lock:
            snapshot = [(s, tuple(e.ranges), e.problems()) for s, e in sorted(self._segments.items())]
        return [
            SegmentDamage(segment, max_transaction_id_of(segment), ranges, tuple(problems))
            for segment, ranges, problems in snapshot
        ]
