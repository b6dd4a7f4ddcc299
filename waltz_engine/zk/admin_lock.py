"""The ``<root>/store/adminLock`` mutex that serializes every store-metadata read-modify-write.

Same recipe as zktools ``ZooKeeperClientImpl.mutex`` so Java tools and ours exclude each other:
create the znode ephemeral (no data); if it exists, watch it and try again on any event. The
original waits forever; we give up after a bounded wait and name the holder's session.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.znodes import ClusterMetadataError, ClusterNotFoundError

ADMIN_LOCK_TIMEOUT_MS = 30_000


class AdminLockTimeoutError(ClusterMetadataError):
    """Another tool held the admin lock for longer than we are willing to wait."""


@contextmanager
def admin_lock(
    client: KazooClient, paths: ClusterPaths, timeout_ms: int = ADMIN_LOCK_TIMEOUT_MS
) -> Iterator[None]:
    assert timeout_ms > 0
    lock_path = paths.admin_lock
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            client.create(lock_path, None, ephemeral=True)
            break
        except NoNodeError:
            raise ClusterNotFoundError(
                f"{paths.store} does not exist (was the cluster created with `waltz create-cluster`?)"
            ) from None
        except NodeExistsError:
            stat, changed = _watch(client, lock_path)
            if stat is None:
                continue  # released between our create and our watch
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not changed.wait(remaining_s):
                raise AdminLockTimeoutError(
                    f"{lock_path} is still held by ZooKeeper session {stat.ephemeralOwner:#x} "
                    f"after {timeout_ms} ms; is another admin tool running?"
                ) from None
    try:
        yield
    finally:
        # NoNode: our session expired and ZooKeeper already released the lock.
        with contextlib.suppress(NoNodeError):
            client.delete(lock_path)


def _watch(client: KazooClient, path: str) -> tuple[Any, threading.Event]:
    """The znode's stat (None if gone) and an event set by the next change to it."""
    changed = threading.Event()

    def wake(_event: Any) -> None:
        changed.set()

    return client.exists(path, watch=wake), changed
