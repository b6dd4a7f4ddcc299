"""How a Spark plan covers a txid range with the replicas' tier copies (spark.tier.cover): the
copy reaching furthest, the network where no manifest holds the txids, cut at the range."""

from __future__ import annotations

from spark.tier import cover
from waltz_engine.common.object_store import FileEntry
from waltz_engine.storage.tier.manifest import TierSegment

ENTRY = FileEntry(1, "0" * 64)


def _copy(prefix: str, first: int, last: int) -> tuple[str, TierSegment]:
    return prefix, TierSegment(first, last, ENTRY, ENTRY)


def test_the_copy_reaching_furthest_then_the_network_for_gaps_and_the_tail() -> None:
    a0, a1 = _copy("a", 0, 9), _copy("a", 10, 19)
    b0, b2 = _copy("b", 0, 14), _copy("b", 30, 39)
    pieces = cover([a1, b2, a0, b0], 5, 45)
    assert pieces == [(5, 14, b0), (15, 19, a1), (20, 29, None), (30, 39, b2), (40, 45, None)]


def test_ties_go_to_the_first_prefix_and_the_range_cuts_the_copies() -> None:
    a, b = _copy("a", 0, 9), _copy("b", 0, 9)
    assert cover([b, a], 3, 6) == [(3, 6, a)]
    assert cover([], 3, 6) == [(3, 6, None)]
    assert cover([a], 7, 6) == []
