"""A Spark slice read from the tier in this process (spark.tier.read_tier_slice over a `file://`
store that `waltz bench export --tier` fills): ranged reads of part of a segment give exactly
the local reader's rows; a flipped bit in the tier object sends the slice's rest to the
network reader and no damaged row is emitted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from storage_node_support import flip_data_bits

from spark.bench_export import BENCH_KEY, generate
from spark.bench_tier import TIER_DIR_NAME, publish_tier
from spark.layout import discover, slices
from spark.segments import read_slice
from spark.tier import SourceCounts, TierSlice, read_tier_slice, tier_copies
from waltz_engine.net.tls import TlsConfig
from waltz_engine.storage.network_reader import NetworkSlice, StoreAccess

ROWS = 300
ROTTEN = 150


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("tier-read")
    generate(directory / "storage", ROWS, 1, data_bytes=20)
    url, _ = publish_tier(directory / "storage", directory)
    return directory, url


def _local(storage: Path, first: int, last: int) -> pa.Table:
    (replica,) = discover([storage])[0]
    return pa.Table.from_batches([b for s in slices(replica, first, last) for b in read_slice(s)])


def _tier_slice(url: str, first: int, last: int) -> TierSlice:
    ((prefix, segment),) = tier_copies(url, BENCH_KEY, 0)
    network = NetworkSlice(0, first, last, (), StoreAccess(BENCH_KEY, 1, TlsConfig()))
    return TierSlice(0, url, prefix, segment, first, last, network)


def _no_network(part: NetworkSlice) -> Iterator[pa.RecordBatch]:
    raise AssertionError(f"read over the network: {part.from_txid}..{part.to_txid}")


@pytest.mark.parametrize(("first", "last"), [(0, ROWS - 1), (100, 199), (250, ROWS - 1)])
def test_a_slice_of_a_tier_segment_reads_as_the_local_files(
    published: tuple[Path, str], first: int, last: int
) -> None:
    directory, url = published
    counts = SourceCounts()
    table = pa.Table.from_batches(read_tier_slice(_tier_slice(url, first, last), _no_network, counts))
    assert table.equals(_local(directory / "storage", first, last))
    assert (counts.tier_rows, counts.fallbacks) == (last - first + 1, 0)


def test_a_rotten_tier_record_sends_the_rest_to_the_network(published: tuple[Path, str]) -> None:
    directory, url = published
    ((prefix, _),) = tier_copies(url, BENCH_KEY, 0)
    flip_data_bits(directory / TIER_DIR_NAME / prefix, [ROTTEN])
    asked: list[tuple[int, int]] = []

    def network(part: NetworkSlice) -> Iterator[pa.RecordBatch]:
        asked.append((part.from_txid, part.to_txid))
        return _local(directory / "storage", part.from_txid, part.to_txid).to_batches()

    counts = SourceCounts()
    try:
        table = pa.Table.from_batches(read_tier_slice(_tier_slice(url, 100, 199), network, counts))
    finally:
        flip_data_bits(directory / TIER_DIR_NAME / prefix, [ROTTEN])  # whole again, for the others
    assert table.equals(_local(directory / "storage", 100, 199))
    # The rotten record's chunk is refused whole: nothing of it came from the tier.
    assert asked == [(100, 199)] and (counts.tier_rows, counts.fallbacks) == (0, 1)
