"""The tier's seam: the object store it writes to and how its rate limit waits.

The tier reaches its store only through a :class:`TierStore` (the calls of
:class:`~waltz_engine.common.object_store.ObjectStore` it makes) opened by the seam's
``open_store``, and its local files (segments to upload, segments read back into the cache)
only through the storage node's :class:`~waltz_engine.storage.file_system.Disk`. Production
passes :data:`OBJECT_STORE_TIER`: ``pyarrow.fs`` stores, and a rate limit that blocks the
tier's thread. The simulator passes an in-memory store with its own faults
(``waltz_engine.sim.object_store``) and a rate limit that owes its waits to the loop (it runs a
thread's work inline: a blocking wait would stop the world, and in real time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from waltz_engine.common.object_store import ObjectStore


class TierStore(Protocol):
    """What the tier calls on its object store; every call may raise ``ObjectStoreError``."""

    url: str

    def remove_debris(self) -> None: ...

    def exists(self, name: str) -> bool: ...

    def read_bytes(self, name: str) -> bytes: ...

    def write_bytes(self, name: str, data: bytes) -> None: ...

    def upload_chunks(
        self, chunks: Iterable[bytes], name: str, throttle: Callable[[int], None] | None = None
    ) -> int:
        """Write ``chunks`` as ``name`` (atomically); the bytes written. ``throttle`` is told
        each chunk's size once it is written."""
        ...

    def download_to(self, name: str, size: int, sink: Callable[[bytes], None]) -> str:
        """The object's first ``size`` bytes, handed to ``sink`` a chunk at a time; their SHA-256."""
        ...

    def checksum(self, name: str, size: int) -> str: ...

    def list_names(self, directory: str = "", files_only: bool = True) -> list[str]: ...

    def delete(self, name: str) -> None: ...


# (url, feature named in a missing-pyarrow error, this writer's temporary directory) -> store
TierStoreOpener = Callable[[str, str, str], TierStore]


@dataclass(frozen=True)
class TierSeam:
    open_store: TierStoreOpener = ObjectStore
    # True: the rate limit sleeps on the tier's thread. False: it never blocks; the time it owes
    # is slept on the loop after each partition's work of a round.
    blocking_rate: bool = True


OBJECT_STORE_TIER = TierSeam()
