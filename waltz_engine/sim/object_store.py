"""An object store in memory, the tier's seam (:class:`~waltz_engine.storage.tier.store.TierStore`)
in the simulator: one bucket every storage node of a seed writes its own prefix of, with faults.

Faults (each set by the world for a while, then healed): ``failing_puts`` refuses every write
(an upload, a manifest, a delete) with ``ObjectStoreError``; ``slow_put_factor`` makes each
upload's bytes cost that many times their size in the tier's rate limit (a slow link to the
store: the node's round takes longer in virtual time); ``failing_gets`` refuses every read (a
get that returns an error: reads of evicted ranges fail, the server reads another replica).
Writes are atomic per object, as the product's store makes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from waltz_engine.common.object_store import ObjectStoreError
from waltz_engine.storage.tier.store import TierSeam, TierStore

# A scheme the node accepts (its settings check it); the seam, not pyarrow, opens it.
SIM_TIER_URL = "s3://sim-tier"


class SimBucket:
    """The objects of one seed's store, and its faults."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.failing_puts = False
        self.failing_gets = False
        self.slow_put_factor = 1.0
        self.puts = 0
        self.gets = 0

    def heal(self) -> None:
        self.failing_puts = self.failing_gets = False
        self.slow_put_factor = 1.0

    def store(self) -> SimObjectStore:
        """A reader's view (the checker's)."""
        return SimObjectStore(self, SIM_TIER_URL, "checker")

    def seam(self) -> TierSeam:
        """What a storage node's tier is built with: this bucket, a rate limit owed to the loop."""
        return TierSeam(lambda url, feature, tmp_dir: SimObjectStore(self, url, tmp_dir), blocking_rate=False)


class SimObjectStore:
    """One writer's view of a :class:`SimBucket` (its own temporary directory)."""

    def __init__(self, bucket: SimBucket, url: str, tmp_dir: str) -> None:
        self._bucket = bucket
        self.url = url
        self.tmp_dir = tmp_dir

    def _put(self, name: str, data: bytes) -> None:
        if self._bucket.failing_puts:
            raise ObjectStoreError(f"{self.url}: cannot write {name}: the store refused the put (503)")
        self._bucket.puts += 1
        self._bucket.objects[name] = data

    def _get(self, name: str) -> bytes:
        if self._bucket.failing_gets:
            raise ObjectStoreError(f"{self.url}: cannot read {name}: the store answered an error (500)")
        self._bucket.gets += 1
        data = self._bucket.objects.get(name)
        if data is None:
            raise ObjectStoreError(f"{self.url}: cannot read {name}: no such object")
        return data

    def remove_debris(self) -> None:
        prefix = self.tmp_dir.rstrip("/") + "/"
        for name in [n for n in self._bucket.objects if n.startswith(prefix)]:
            self.delete(name)

    def exists(self, name: str) -> bool:
        if self._bucket.failing_gets:
            raise ObjectStoreError(f"{self.url}: cannot look at {name}: the store answered an error (500)")
        return name in self._bucket.objects

    def read_bytes(self, name: str) -> bytes:
        return self._get(name)

    def write_bytes(self, name: str, data: bytes) -> None:
        self._put(name, bytes(data))

    def upload_chunks(
        self, chunks: Iterable[bytes], name: str, throttle: Callable[[int], None] | None = None
    ) -> int:
        data = bytearray()
        for chunk in chunks:
            data += chunk
            if throttle is not None:
                throttle(round(len(chunk) * self._bucket.slow_put_factor))
        self._put(name, bytes(data))
        return len(data)

    def download_to(self, name: str, size: int, sink: Callable[[bytes], None]) -> str:
        data = self._get(name)
        if len(data) < size:
            raise ObjectStoreError(f"{self.url}: {name} holds {len(data)} bytes, the manifest names {size}")
        sink(data[:size])
        return hashlib.sha256(data[:size]).hexdigest()

    def checksum(self, name: str, size: int) -> str:
        return self.download_to(name, size, lambda _: None)

    def list_names(self, directory: str = "", files_only: bool = True) -> list[str]:
        prefix = directory.rstrip("/") + "/" if directory else ""
        found = set()
        for name in self._bucket.objects:
            if name.startswith(prefix):
                head, _, rest = name[len(prefix) :].partition("/")
                if not rest or not files_only:
                    found.add(head)
        return sorted(found)

    def delete(self, name: str) -> None:
        if self._bucket.failing_puts:
            raise ObjectStoreError(f"{self.url}: cannot delete {name}: the store refused (503)")
        self._bucket.objects.pop(name, None)


def _check(store: SimObjectStore) -> TierStore:
    return store  # the simulator's store has the tier's seam's shape (checked by mypy)
