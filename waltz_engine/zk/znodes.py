"""Reading and writing single znodes with kazoo: typed payloads, versions for CAS, clear errors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz_engine.common.errors import FormatError, WaltzError

T = TypeVar("T")

NO_VERSION = -1  # ZooKeeper's "any version" for set and delete


class ClusterMetadataError(WaltzError):
    """Cluster metadata in ZooKeeper is missing, malformed, or a change to it was refused."""


class ClusterNotFoundError(ClusterMetadataError):
    """A znode that a created cluster always has is missing."""


class ClusterExistsError(ClusterMetadataError):
    """create-cluster found something already at the cluster root."""


class ConcurrentUpdateError(ClusterMetadataError):
    """A compare-and-set lost against another writer (the znode version moved)."""


def read_optional(
    client: KazooClient, path: str, decode: Callable[[bytes], T]
) -> tuple[T | None, int] | None:
    """``(payload or None when data-less, version)``, or None when the znode does not exist."""
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return None
    if data is None:
        return None, stat.version
    try:
        return decode(data), stat.version
    except FormatError as e:
        raise ClusterMetadataError(f"znode {path} holds data that cannot be decoded: {e}") from None


def read_required(client: KazooClient, path: str, decode: Callable[[bytes], T]) -> tuple[T, int]:
    """Like :func:`read_optional` but a missing znode or missing data is an error."""
    found = read_optional(client, path, decode)
    if found is None:
        raise ClusterNotFoundError(
            f"znode {path} does not exist (was the cluster created with `waltz create-cluster`?)"
        )
    value, version = found
    if value is None:
        raise ClusterNotFoundError(f"znode {path} holds no data (cluster metadata is incomplete)")
    return value, version


def write(client: KazooClient, path: str, data: bytes | None, expected_version: int) -> int:
    """Set with CAS on ``expected_version`` (``NO_VERSION`` = unconditional); returns the new version."""
    try:
        stat = client.set(path, data, version=expected_version)
    except BadVersionError:
        raise ConcurrentUpdateError(
            f"znode {path} changed since version {expected_version} was read (concurrent update); retry"
        ) from None
    except NoNodeError:
        raise ClusterNotFoundError(f"znode {path} does not exist") from None
    version: int = stat.version
    return version


def create(client: KazooClient, path: str, data: bytes | None, *, ephemeral: bool = False) -> str:
    """Create one znode (``data=None`` stores no data at all, as Java's ``create(path, null)``)."""
    try:
        created: str = client.create(path, data, ephemeral=ephemeral)
    except NodeExistsError:
        raise ClusterMetadataError(f"znode {path} already exists") from None
    return created


def create_ancestors(client: KazooClient, path: str) -> None:
    """Create the missing parents of ``path`` without data, as zktools ``createPath`` does."""
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        with contextlib.suppress(NodeExistsError):
            client.create("/" + "/".join(parts[:depth]), None)
