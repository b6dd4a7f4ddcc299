"""Retention in the tier: a replica's tier copies of segments wholly below the partition's
effective retention bound (retention and export watermarks, as local retention uses) go too.

The manifest is rewritten first, then the objects are deleted: no manifest ever names a deleted
object. A node killed in between leaves objects no manifest names; the next sweep (the first
round after a start, and every round that removed something) deletes those below the bound.
Only what the partition no longer serves goes (below its retained start), so no read of the
partition ever looks for a deleted object.
"""

from __future__ import annotations

import posixpath

from waltz_engine.storage.constants import INDEX_SUFFIX, SEGMENT_SUFFIX
from waltz_engine.storage.tier.manifest import TierManifest
from waltz_engine.storage.tier.store import TierStore


def remove_below(manifest: TierManifest, end: int) -> list[tuple[int, int]]:
    """Take the segments ending below ``end`` out of the manifest; their (first, max) txids.
    Their objects stay until :func:`sweep`."""
    doomed = sorted(s.span for s in manifest.segments.values() if s.max_transaction_id < end)
    if doomed:
        manifest.remove(first for first, _ in doomed)
    return doomed


def sweep(store: TierStore, manifest: TierManifest, end: int) -> int:
    """Delete the prefix's segment objects that start below ``end`` and that the manifest does
    not name (an upload in progress is of a local segment, at or above the partition's start);
    how many."""
    deleted = 0
    for name in store.list_names(manifest.prefix):
        stem, suffix = posixpath.splitext(name)
        if suffix not in (SEGMENT_SUFFIX, INDEX_SUFFIX) or not stem.isdigit():
            continue
        first = int(stem)
        if first < end and first not in manifest.segments:
            store.delete(posixpath.join(manifest.prefix, name))
            deleted += 1
    return deleted
