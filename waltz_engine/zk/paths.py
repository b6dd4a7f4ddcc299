"""Where everything lives under a cluster root (reference §2.2), and which payload each znode holds."""

from __future__ import annotations

import re
from typing import NamedTuple

from waltz_engine.common.errors import WaltzError

SERVER_DESCRIPTOR_PREFIX = "s_"
_SERVER_DESCRIPTOR_NAME = re.compile(r"s_\d+")
_PARTITION_NAME = re.compile(r"\d+")
_PATH_SEGMENT = re.compile(r"[^/\x00]+")


class ClusterRootError(WaltzError):
    """A cluster root is not a usable absolute ZooKeeper path."""


def normalize_root(root: str) -> str:
    """An absolute path without a trailing slash; ZooKeeper refuses anything else."""
    trimmed = root.rstrip("/") if root != "/" else root
    if not trimmed.startswith("/") or trimmed == "/":
        raise ClusterRootError(f"cluster root must be an absolute ZooKeeper path below '/', got '{root}'")
    segments = trimmed[1:].split("/")
    if not all(_PATH_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        raise ClusterRootError(f"cluster root '{root}' is not a valid ZooKeeper path")
    return trimmed


class ClusterPaths(NamedTuple):
    root: str

    @classmethod
    def of(cls, root: str) -> ClusterPaths:
        return cls(normalize_root(root))

    @property
    def server_descriptors(self) -> str:
        return f"{self.root}/serverDescriptors"

    @property
    def server_descriptor_prefix(self) -> str:
        return f"{self.server_descriptors}/{SERVER_DESCRIPTOR_PREFIX}"

    @property
    def forced_assignments(self) -> str:
        """Our extension (original issue #6); Java servers ignore znodes they do not know."""
        return f"{self.root}/forcedAssignments"

    @property
    def replica_moves(self) -> str:
        """Our extension (issue 24): the replica moves under way, JSON; Java nodes never read it."""
        return f"{self.root}/replicaMoves"

    @property
    def replica_mover_lease(self) -> str:
        """Our extension: the ephemeral lease of the one process moving replicas."""
        return f"{self.replica_moves}/lease"

    @property
    def ids(self) -> str:
        return f"{self.root}/ids"

    @property
    def client_ids(self) -> str:
        return f"{self.ids}/client"

    @property
    def server_ids(self) -> str:
        return f"{self.ids}/server"

    @property
    def store(self) -> str:
        return f"{self.root}/store"

    @property
    def partitions(self) -> str:
        return f"{self.store}/partition"

    def partition(self, partition_id: int) -> str:
        assert partition_id >= 0
        return f"{self.partitions}/{partition_id}"

    @property
    def assignment(self) -> str:
        return f"{self.store}/assignment"

    @property
    def group(self) -> str:
        return f"{self.store}/group"

    @property
    def connection(self) -> str:
        return f"{self.store}/connection"

    @property
    def admin_lock(self) -> str:
        return f"{self.store}/adminLock"

    def kind_of(self, path: str) -> str | None:
        """The payload kind (as named in the vectors) a znode holds, or None for data-less znodes."""
        fixed = {
            self.root: "ClusterParams",
            self.server_descriptors: "PartitionAssignment",
            self.forced_assignments: "ForcedAssignments",
            self.client_ids: "Integer",
            self.server_ids: "Integer",
            self.store: "StoreParams",
            self.assignment: "ReplicaAssignments",
            self.group: "GroupDescriptor",
            self.connection: "ConnectionMetadata",
        }
        if path in fixed:
            return fixed[path]
        parent, _, name = path.rpartition("/")
        if parent == self.server_descriptors and _SERVER_DESCRIPTOR_NAME.fullmatch(name):
            return "ServerDescriptor"
        if parent == self.partitions and _PARTITION_NAME.fullmatch(name):
            return "PartitionMetadata"
        return None
