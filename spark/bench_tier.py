"""``waltz bench export --network --tier``: the generated log's segments put in a ``file://``
tier, as a storage node uploads them (one replica's prefix and manifest), so that an export
with ``--tier-url`` reads them from the object store instead of the node."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from spark.bench_export import BENCH_KEY
from spark.layout import discover
from waltz_engine.common.object_store import FileEntry, ObjectStore, sha256_of_file
from waltz_engine.storage.tier.manifest import (
    TierManifest,
    TierSegment,
    object_names,
    replica_prefix,
    tmp_dir,
)

TIER_DIR_NAME = "tier"
# The prefix of the one replica whose copies the bench publishes.
BENCH_REPLICA = "bench_0"


def publish_tier(storage: Path, directory: Path) -> tuple[str, float]:
    """Every segment of ``storage`` (all committed) in a fresh tier under ``directory``; its
    URL and the seconds the copy took."""
    tier = directory / TIER_DIR_NAME
    shutil.rmtree(tier, ignore_errors=True)
    tier.mkdir(parents=True)
    url = tier.as_uri()
    started = time.perf_counter()
    store = ObjectStore(url, "waltz bench export --tier", tmp_dir(BENCH_KEY, BENCH_REPLICA))
    for partition_id, (replica, *_) in sorted(discover([storage]).items()):
        manifest = TierManifest(store, replica_prefix(BENCH_KEY, partition_id, BENCH_REPLICA), {})
        ends = [first - 1 for first, _ in replica.segments[1:]] + [replica.max_txid]
        for (first, path), last in zip(replica.segments, ends, strict=True):
            entries = []
            for local, name in zip(
                (path, path.with_suffix(".idx")), object_names(manifest.prefix, first), strict=True
            ):
                entries.append(FileEntry(store.upload(local, name), sha256_of_file(local)))
            manifest.add(TierSegment(first, last, entries[0], entries[1]))
    return url, time.perf_counter() - started
