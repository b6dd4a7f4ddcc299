"""Every znode under a cluster root, raw and decoded, in the shape of the vectors' ``znodes.jsonl``.

That shape has the original's camelCase field names (``numChildren``, ``numPartitions``);
:func:`snake_case_keys` gives the form every ``--json`` output uses.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_engine.common.errors import FormatError
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import decode_payload
from waltz_engine.zk.znodes import ClusterNotFoundError


class ZnodeRecord(NamedTuple):
    path: str
    data: bytes | None  # None: the znode holds no data at all (not even an empty array)
    ephemeral: bool
    version: int
    cversion: int
    num_children: int
    kind: str | None
    decoded: Any  # the payload's JSON form; None when there is no kind or decoding failed
    error: str | None  # why decoding failed

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "path": self.path,
            "hex": (self.data or b"").hex(),
            "data_null": self.data is None,
            "ephemeral": self.ephemeral,
            "version": self.version,
            "cversion": self.cversion,
            "numChildren": self.num_children,
        }
        if self.kind is not None:
            record["kind"] = self.kind
            record["decoded" if self.error is None else "error"] = (
                self.decoded if self.error is None else self.error
            )
        return record


_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def snake_case(name: str) -> str:
    """``numChildren`` → ``num_children``; a snake_case name stays as it is."""
    return _WORD_START.sub("_", name).lower()


def snake_case_keys(value: Any) -> Any:
    """``value`` with every mapping key in snake_case, at any depth (every key of a znode record
    and of a decoded payload is a field name, never data)."""
    if isinstance(value, dict):
        return {snake_case(str(k)): snake_case_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake_case_keys(v) for v in value]
    return value


def describe_znode(paths: ClusterPaths, path: str, data: bytes | None, stat: Any) -> ZnodeRecord:
    kind = paths.kind_of(path)
    decoded: Any = None
    error: str | None = None
    if kind is not None and data is not None:
        try:
            decoded = decode_payload(kind, data).to_json()
        except FormatError as e:
            error = str(e)
    elif kind is not None:
        error = "znode holds no data"
    return ZnodeRecord(
        path=path,
        data=data,
        ephemeral=stat.ephemeralOwner != 0,
        version=stat.version,
        cversion=stat.cversion,
        num_children=stat.numChildren,
        kind=kind,
        decoded=decoded,
        error=error,
    )


def dump_znodes(client: KazooClient, root: str) -> list[ZnodeRecord]:
    """Depth-first walk of the cluster tree, sorted by path; znodes vanishing mid-walk are skipped."""
    paths = ClusterPaths.of(root)
    if client.exists(paths.root) is None:
        raise ClusterNotFoundError(f"cluster root [{paths.root}] does not exist")
    records: list[ZnodeRecord] = []
    pending = [paths.root]
    while pending:
        path = pending.pop()
        try:
            data, stat = client.get(path)
            children = client.get_children(path)
        except NoNodeError:
            continue  # an ephemeral znode (server, admin lock) went away while we walked
        records.append(describe_znode(paths, path, data, stat))
        pending.extend(f"{path}/{child}" for child in children)
    return sorted(records, key=lambda record: record.path)
