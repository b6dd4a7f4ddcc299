"""ACLs: allow or deny a principal (or ``*``) an operation on partitions; deny wins.

Kept in one znode under the cluster root, ``<root>/acl`` (our extension: Java 0.13.2 nodes and
tools never read it), as JSON ``{"version": 1, "entries": [{"principal", "operation",
"partitions", "permission"}]}``; ``partitions`` is ``*`` (every partition, and requests about no
one partition: the node's metrics, its assignment) or ids and ranges (``0-3,7``). Changes are
compare-and-set on the znode's version, so two operators' grants never lose one another.

Operations and the requests they cover (what each port checks):

- ``append``: APPEND (its locks included) and FLUSH;
- ``read``: MOUNT, FEED, TRANSACTION_DATA, HIGH_WATER_MARK; on a storage node's admin port
  RECORD_LIST, LAST_SESSION_INFO, METRICS and ASSIGNED_PARTITION_STATUS;
- ``admin``: the server admin messages (ADD/REMOVE_PREFERRED_PARTITION, which move ownership;
  CHECK_STORAGE_CONNECTIVITY; SERVER_PARTITIONS_ASSIGNMENT/HEALTH_STAT), every write on a storage
  node's admin port, and every request on its data port.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz_engine.auth.principal import ANY_PRINCIPAL, PrincipalError, normalize_principal
from waltz_engine.common.errors import WaltzError
from waltz_engine.zk.partition_ranges import (
    PartitionRangeError,
    format_partition_ranges,
    parse_partition_ranges,
)
from waltz_engine.zk.paths import normalize_root

ACL_ZNODE = "acl"
ACL_FORMAT_VERSION = 1
APPEND, READ, ADMIN = "append", "read", "admin"
OPERATIONS = (APPEND, READ, ADMIN)
ALLOW, DENY = "allow", "deny"
ALL_PARTITIONS = "*"
# A request about no one partition (a node's metrics, a server's assignment): only an entry on
# every partition covers it.
NO_PARTITION = -1
# Compare-and-set tries before a grant gives up (another writer changed the znode each time).
MAX_CAS_ATTEMPTS = 20


class AclError(WaltzError):
    """An ACL entry or the ACL znode is not usable; the message says what to fix."""


def acl_path(cluster_root: str) -> str:
    return f"{normalize_root(cluster_root)}/{ACL_ZNODE}"


@dataclass(frozen=True, order=True)
class AclEntry:
    principal: str
    operation: str
    partitions: str  # ALL_PARTITIONS or normalized ranges ("0-3,7")
    permission: str = ALLOW

    def covers(self, partition_id: int) -> bool:
        if self.partitions == ALL_PARTITIONS:
            return True
        if partition_id == NO_PARTITION:
            return False
        return partition_id in _ids(self.partitions)

    def matches(self, principal: str, operation: str, partition_id: int) -> bool:
        return (
            (self.principal == ANY_PRINCIPAL or self.principal == principal)
            and self.operation == operation
            and self.covers(partition_id)
        )

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "operation": self.operation,
            "partitions": self.partitions,
            "permission": self.permission,
        }

    def describe(self) -> str:
        return f"{self.permission} {self.principal} {self.operation} on partitions {self.partitions}"


_ids_cache: dict[str, frozenset[int]] = {}


def _ids(ranges: str) -> frozenset[int]:
    found = _ids_cache.get(ranges)
    if found is None:
        found = _ids_cache[ranges] = frozenset(parse_partition_ranges(ranges))
    return found


def parse_operations(text: str | Sequence[str]) -> list[str]:
    """``append,read`` (or a list of them) as operations; an unknown one is an AclError."""
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    found: list[str] = []
    for part in parts:
        operation = part.strip().lower()
        if operation not in OPERATIONS:
            raise AclError(f"unknown operation {part.strip()!r}: give one or more of {', '.join(OPERATIONS)}")
        if operation not in found:
            found.append(operation)
    if not found:
        raise AclError(f"no operation given: give one or more of {', '.join(OPERATIONS)}")
    return found


def parse_partitions(text: str) -> str:
    """``*``/``all`` or ids and ranges, normalized (``3,0-2`` → ``0-3``)."""
    value = text.strip()
    if value.lower() in (ALL_PARTITIONS, "all"):
        return ALL_PARTITIONS
    try:
        return format_partition_ranges(parse_partition_ranges(value))
    except PartitionRangeError as e:
        raise AclError(f"{e} (or * for every partition)") from None


def make_entries(principal: str, operations: Iterable[str], partitions: str, deny: bool) -> list[AclEntry]:
    try:
        who = normalize_principal(principal)
    except PrincipalError as e:
        raise AclError(str(e)) from None
    where = parse_partitions(partitions)
    permission = DENY if deny else ALLOW
    return [AclEntry(who, operation, where, permission) for operation in parse_operations(list(operations))]


class Decision(NamedTuple):
    allowed: bool
    # The entry that decided (None: no entry matched, so denied by default).
    entry: AclEntry | None


class Acls:
    """A set of entries and how they decide: a matching deny wins, else a matching allow, else no."""

    def __init__(self, entries: Iterable[AclEntry] = ()) -> None:
        self.entries: tuple[AclEntry, ...] = tuple(sorted(set(entries)))
        # A request looks only at its principal's entries and everyone's, not at the whole list.
        by_principal: dict[str, list[AclEntry]] = {}
        for entry in self.entries:
            by_principal.setdefault(entry.principal, []).append(entry)
        everyone = by_principal.get(ANY_PRINCIPAL, [])
        self._by_principal = {
            principal: tuple(found if principal == ANY_PRINCIPAL else [*found, *everyone])
            for principal, found in by_principal.items()
        }
        self._everyone = tuple(everyone)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Acls) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    def decide(self, principal: str, operation: str, partition_id: int) -> Decision:
        allow: AclEntry | None = None
        for entry in self._by_principal.get(principal, self._everyone):
            if entry.matches(principal, operation, partition_id):
                if entry.permission == DENY:
                    return Decision(False, entry)
                allow = allow or entry
        return Decision(allow is not None, allow)

    def with_entries(self, entries: Iterable[AclEntry]) -> Acls:
        return Acls([*self.entries, *entries])

    def without_entries(self, entries: Iterable[AclEntry]) -> Acls:
        gone = set(entries)
        return Acls(e for e in self.entries if e not in gone)

    def to_bytes(self) -> bytes:
        document = {"version": ACL_FORMAT_VERSION, "entries": [e.to_json() for e in self.entries]}
        return json.dumps(document, indent=1, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | None, where: str = ACL_ZNODE) -> Acls:
        if not data:
            return cls()
        try:
            document: Any = json.loads(data)
            if document.get("version") != ACL_FORMAT_VERSION:
                raise AclError(f"{where}: unknown ACL format version {document.get('version')!r}")
            entries = [
                AclEntry(
                    str(e["principal"]),
                    str(e["operation"]),
                    str(e["partitions"]),
                    str(e.get("permission", ALLOW)),
                )
                for e in document["entries"]
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise AclError(f"{where}: not an ACL document ({type(e).__name__}: {e})") from None
        for entry in entries:
            if entry.operation not in OPERATIONS or entry.permission not in (ALLOW, DENY):
                raise AclError(f"{where}: bad entry {entry.to_json()}")
            if entry.partitions != ALL_PARTITIONS:
                try:
                    _ids(entry.partitions)
                except PartitionRangeError as e:
                    raise AclError(f"{where}: bad entry {entry.to_json()}: {e}") from None
        return cls(entries)


def read_acls(zk: KazooClient, cluster_root: str) -> tuple[Acls, int]:
    """The ACLs and the znode's version (-1: no znode yet, so no entry)."""
    path = acl_path(cluster_root)
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return Acls(), -1
    return Acls.from_bytes(data, path), stat.version


def change_acls(
    zk: KazooClient, cluster_root: str, add: Iterable[AclEntry] = (), remove: Iterable[AclEntry] = ()
) -> tuple[Acls, Acls]:
    """Add and remove entries with compare-and-set; the ACLs before and after."""
    added, removed = list(add), list(remove)
    path = acl_path(cluster_root)
    for _ in range(MAX_CAS_ATTEMPTS):
        before, version = read_acls(zk, cluster_root)
        after = before.with_entries(added).without_entries(removed)
        try:
            if version < 0:
                zk.create(path, after.to_bytes(), makepath=True)
            else:
                zk.set(path, after.to_bytes(), version=version)
        except (BadVersionError, NodeExistsError):
            continue  # another writer came first: read again
        return before, after
    raise AclError(f"{path} kept changing under this change ({MAX_CAS_ATTEMPTS} tries): try again")
