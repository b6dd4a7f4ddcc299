"""Which segment holds a transaction: binary search over the segments' first txids."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Span(Protocol):
    @property
    def first_transaction_id(self) -> int: ...

    @property
    def max_transaction_id(self) -> int: ...


S = TypeVar("S", bound=_Span)


def find_segment(segments: Sequence[S], transaction_id: int) -> S | None:
    """The segment containing ``transaction_id``, or None. ``segments`` are sorted by first txid
    and contiguous, so the candidate is the last one starting at or before the txid."""
    position = bisect.bisect_right(segments, transaction_id, key=lambda s: s.first_transaction_id) - 1
    if position < 0:
        return None
    candidate = segments[position]
    return candidate if transaction_id <= candidate.max_transaction_id else None
