"""Export watermarks in ZooKeeper: per partition, the highest txid an export has durably taken.

One codec for both sides: exports (``spark``) publish them, storage nodes' retention cleaners
read them so no segment an export still needs is removed. It lives in the engine because the
storage node must not import the ``spark`` package (that would drag Spark into it).

``<cluster.root>/exports/<export-id>``, ``DataOutputStream`` (big-endian)::

    int8 version = 1, int32 n, n x (int32 partitionId, int64 watermarkTxid)

partitions in ascending order; written with CAS on the znode version. Java nodes ignore
znodes they do not know.
"""

from __future__ import annotations

from collections.abc import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from waltz_engine.common.errors import FormatError
from waltz_engine.zk.java_io import DataReader, DataWriter, JavaFormatError
from waltz_engine.zk.paths import normalize_root
from waltz_engine.zk.znodes import NO_VERSION, ConcurrentUpdateError, create_ancestors, read_optional, write

EXPORT_WATERMARKS_VERSION = 1
EXPORTS_ZNODE = "exports"
# Bytes of one (partitionId, watermarkTxid) entry, to bound the count a payload claims.
_ENTRY_SIZE_BYTES = 4 + 8
# Attempts of a read-merge-CAS publish: a second one absorbs one concurrent writer.
_PUBLISH_ATTEMPTS = 2

# partition id -> highest exported txid
Watermarks = dict[int, int]


def encode_export_watermarks(watermarks: Mapping[int, int]) -> bytes:
    writer = DataWriter().write_int8(EXPORT_WATERMARKS_VERSION).write_int32(len(watermarks))
    for partition_id in sorted(watermarks):
        writer.write_int32(partition_id).write_int64(watermarks[partition_id])
    return writer.to_bytes()


def decode_export_watermarks(data: bytes) -> Watermarks:
    reader = DataReader(data, "export watermarks")
    version = reader.read_int8()
    if version != EXPORT_WATERMARKS_VERSION:
        raise JavaFormatError(
            f"export watermarks: unsupported version {version} (expected {EXPORT_WATERMARKS_VERSION})"
        )
    count = reader.read_count(_ENTRY_SIZE_BYTES)
    result: Watermarks = {}
    for _ in range(count):
        partition_id = reader.read_int32()
        result[partition_id] = reader.read_int64()
    reader.expect_end()
    return result


def exports_path(cluster_root: str) -> str:
    return f"{normalize_root(cluster_root)}/{EXPORTS_ZNODE}"


def export_path(cluster_root: str, export_id: str) -> str:
    if not export_id or "/" in export_id or export_id in (".", ".."):
        raise FormatError(f"export id must be a single znode name, got {export_id!r}")
    return f"{exports_path(cluster_root)}/{export_id}"


def read_one_export_watermarks(
    client: KazooClient, cluster_root: str, export_id: str
) -> tuple[Watermarks, int] | None:
    """``(watermarks, znode version)`` of one export, None when it never published."""
    found = read_optional(client, export_path(cluster_root, export_id), decode_export_watermarks)
    if found is None:
        return None
    value, version = found
    return (value or {}), version


def read_export_watermarks(client: KazooClient, cluster_root: str) -> dict[str, Watermarks]:
    """Every export's watermarks (what retention must respect), by export id."""
    try:
        names = client.get_children(exports_path(cluster_root))
    except NoNodeError:
        return {}
    result: dict[str, Watermarks] = {}
    for name in sorted(names):
        found = read_one_export_watermarks(client, cluster_root, name)
        if found is not None:  # None: deleted meanwhile
            result[name] = found[0]
    return result


def write_export_watermarks(
    client: KazooClient,
    cluster_root: str,
    export_id: str,
    watermarks: Mapping[int, int],
    expected_version: int,
) -> int:
    """CAS-write one export's watermarks; ``expected_version`` NO_VERSION creates the znode (it
    must not exist then). Returns the new version; a lost race is a ConcurrentUpdateError."""
    path = export_path(cluster_root, export_id)
    data = encode_export_watermarks(watermarks)
    if expected_version == NO_VERSION:
        create_ancestors(client, path)
        try:
            client.create(path, data)
        except NodeExistsError:
            raise ConcurrentUpdateError(f"znode {path} was created concurrently; retry") from None
        return 0
    return write(client, path, data, expected_version)


def publish_export_watermarks(
    client: KazooClient, cluster_root: str, export_id: str, watermarks: Mapping[int, int]
) -> int:
    """Replace the export's published watermarks by ``watermarks`` (partitions not in it keep
    their published value): read, merge, CAS-write; retried once on a lost race."""
    for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
        found = read_one_export_watermarks(client, cluster_root, export_id)
        merged, version = (dict(found[0]), found[1]) if found is not None else ({}, NO_VERSION)
        merged.update(watermarks)
        try:
            return write_export_watermarks(client, cluster_root, export_id, merged, version)
        except ConcurrentUpdateError:
            if attempt == _PUBLISH_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
