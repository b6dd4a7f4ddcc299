"""``waltz backup restore``: a backup (its newest manifest) into a new storage directory that a
storage node, ours or the original's, starts on.

Every file is checked against the manifest on the way. The control file is written anew with
the storage engine's writer: the restored partitions are assigned and available, their
low-water mark and local low-water mark are the last restored transaction (every record in a
backup was committed), and their session id is -1, older than any session the cluster issued.
So the server's next store session does not let the restored replica vote: it keeps what the
replica holds up to its low-water mark and catches it up from the other replicas (see
``waltz_engine.server.store.recovery``). With ``to_txid`` the log is cut after that
transaction (a point in time).

When every replica of a partition was lost, nobody could catch the restored copies up: then
(``session_ids`` from :func:`issued_sessions`) each restored partition takes the session ZooKeeper
last issued for it, so the next store session's recovery lets it vote with the backup's last
transaction, and the partition resumes there. What was committed after the backup is lost.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from waltz_engine.common.record import Record
from waltz_engine.disk.segment_reader import (
    KIND_INDEX_BEYOND_DATA,
    KIND_INDEX_MISMATCH,
    KIND_INDEX_MISSING,
    KIND_INDEX_PARTIAL_ENTRY,
    KIND_UNINDEXED_RECORD,
    SegmentProblem,
    SegmentReader,
)
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.backup.manifest import NO_TRANSACTION, BackupError, require_latest
from waltz_engine.ops.backup.store import BackupStore
from waltz_engine.ops.backup.verify import fetch_checked
from waltz_engine.storage.admin_ops import StorageAdminError, StorageContext, admin_client, read_store_layout
from waltz_engine.storage.admin_ops.layout import StoreLayout
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.constants import DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES
from waltz_engine.storage.node.partition_worker import METRIC_GROUP_PREFIX as PARTITION_GAUGE_PREFIX
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.zk.cluster import read_server_descriptors
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.java_io import JavaHashMap
from waltz_engine.zk.payloads import UNRESOLVED_HIGH_WATER_MARK, PartitionMetadata, ReplicaId, ReplicaState
from waltz_engine.zk.retention import read_effective_bounds
from waltz_engine.zk.store_metadata import (
    read_partition_metadata,
    read_replica_assignments,
    read_store_params,
    write_partition_metadata,
)

if TYPE_CHECKING:
    from kazoo.client import KazooClient

Progress = Callable[[int, int], None]  # (files restored, files to restore)
# The session id of a restored partition: older than every store session the cluster issues.
RESTORED_SESSION_ID = -1
# How long the check for surviving replicas waits for each storage node.
SURVIVOR_CHECK_TIMEOUT_MS = 3_000
# The store session of a re-created cluster's partition that never had one.
FIRST_SESSION_ID = 0
# The records of a restore are appended (and synced) in batches of at most this many, or bytes.
REWRITE_BATCH_RECORDS = 4096
REWRITE_BATCH_BYTES = 8 * 1024 * 1024
# What a segment reader finds wrong with a backup's index, which a restore does not use.
_INDEX_PROBLEMS = frozenset(
    {
        KIND_INDEX_MISSING,
        KIND_INDEX_PARTIAL_ENTRY,
        KIND_INDEX_MISMATCH,
        KIND_INDEX_BEYOND_DATA,
        KIND_UNINDEXED_RECORD,
    }
)


@dataclass
class RestoreSummary:
    url: str
    directory: str
    sequence: int
    files: int = 0
    bytes: int = 0
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES
    # Whether the cluster's retention bounds were read (and no record below them restored).
    retention_bounds_read: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "directory": self.directory,
            "sequence": self.sequence,
            "files": self.files,
            "bytes": self.bytes,
            "segment_size_bytes": self.segment_size_bytes,
            "retention_bounds_read": self.retention_bounds_read,
            "partitions": {str(p): v for p, v in sorted(self.partitions.items())},
        }


def issued_sessions(url: str, settings: ZooKeeperSettings, tls: TlsConfig) -> dict[int, int]:
    """Per partition, the store session ZooKeeper last issued; the cluster there must be the
    backup's (same key and partition count), with no server registered and no storage node
    answering that holds a partition past the backup's end (a surviving replica: restored copies
    that vote could outvote its newer commits)."""
    manifest = require_latest(BackupStore(url))
    root = settings.cluster_root
    with connect(settings) as client:
        params = read_store_params(client, root)
        if params.key != manifest.cluster_key or params.num_partitions != manifest.num_partitions:
            raise BackupError(
                f"the cluster at {root} (key {params.key}, {params.num_partitions} "
                f"partitions) is not the backup's (key {manifest.cluster_key}, {manifest.num_partitions} "
                "partitions); re-create it with the backup's key: waltz create-cluster --cluster-key"
            )
        servers = read_server_descriptors(client, root)
        if servers:
            raise BackupError(
                f"{len(servers)} server(s) registered at {root}: stop every server first (a killed "
                "server's registration lasts its ZooKeeper session timeout)"
            )
        layout = read_store_layout(client, root)
        ends = {p: entry.last_txid for p, entry in manifest.partitions.items()}
        context = layout.context(client_context(tls), SURVIVOR_CHECK_TIMEOUT_MS)
        survivors = asyncio.run(_surviving_copies(layout, context, ends))
        if survivors:
            raise BackupError(
                f"{survivors[0]}, past the backup's end: a replica survives; restore without "
                "--all-replicas-lost and let catch-up bring the copy up to date (docs/operations.md)"
            )
        return {p: _issued_session(client, root, p) for p in manifest.partitions}


async def _surviving_copies(
    layout: StoreLayout, context: StorageContext, ends: Mapping[int, int]
) -> list[str]:
    """The storage nodes that answer and hold a partition past its backup's end (the others are
    down, being restored)."""
    found = []
    for storage, partitions in sorted(layout.assignments.items()):
        address = layout.admin_address(storage)
        try:
            async with admin_client(context, address) as admin:
                metrics = await admin.metrics()
        except (StorageAdminError, StorageRpcError, OSError, TimeoutError):
            continue
        gauges = metrics.get("gauges")
        if not isinstance(gauges, dict):
            continue
        for p in partitions:
            entry = gauges.get(f"{PARTITION_GAUGE_PREFIX}{p}.max-transaction-id")
            value = entry.get("value") if isinstance(entry, dict) else None
            if p in ends and isinstance(value, int) and value > ends[p]:
                found.append(f"storage node {storage} holds partition {p} up to transaction {value}")
    return found


def _issued_session(client: KazooClient, root: str, partition_id: int) -> int:
    """The partition's store session. A cluster re-created after ZooKeeper was lost too has none
    yet and no replica states, and its first recovery would resolve an empty log (refused by
    every restored node): the partition's assigned storage nodes become its replicas of a first
    session, which the restored copies then join."""
    metadata, version = read_partition_metadata(client, root, partition_id)
    if metadata.replica_states:
        return metadata.session_id
    replicas = [
        s for s, held in read_replica_assignments(client, root).as_dict().items() if partition_id in held
    ]
    if not replicas:
        raise BackupError(
            f"partition {partition_id} is assigned to no storage node in ZooKeeper: register the nodes "
            "first (waltz zk add-storage-node, waltz zk assign-partition)"
        )
    session_id = max(metadata.session_id, FIRST_SESSION_ID)
    states = JavaHashMap.from_items(
        ReplicaId.java_hash,
        (
            (
                ReplicaId(partition_id, s),
                ReplicaState(ReplicaId(partition_id, s), session_id, UNRESOLVED_HIGH_WATER_MARK),
            )
            for s in replicas
        ),
    )
    write_partition_metadata(
        client, root, partition_id, PartitionMetadata.of_map(metadata.generation, session_id, states), version
    )
    return session_id


def restore_backup(
    url: str,
    directory: Path,
    *,
    to_txid: int | None = None,
    partitions: Sequence[int] | None = None,
    session_ids: Mapping[int, int] | None = None,
    progress: Progress | None = None,
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES,
    retention_from: ZooKeeperSettings | None = None,
) -> RestoreSummary:
    """``session_ids``: see the module's docstring (None: the restored copies do not vote).

    The records are written anew, as the node that starts on ``directory`` writes them: in
    segments of ``segment_size_bytes`` (its ``storage.segment.size.threshold``) with indexes of
    their own, so its retention and tier treat them as any replica's. What was downloaded is
    checked against the manifest (each file's SHA-256) and, as it is read, record by record (both
    checksums, txids in sequence). ``retention_from``: the backup's cluster, whose effective
    retention bounds are read: no record below a partition's bound is restored, its log begins
    there, so the replica never serves what retention removed everywhere else.
    """
    if segment_size_bytes <= 0:
        raise BackupError(f"the segment size must be positive, got {segment_size_bytes}")
    store = BackupStore(url)
    manifest = require_latest(store)
    wanted = sorted(manifest.partitions) if partitions is None else sorted(set(partitions))
    missing = [p for p in wanted if p not in manifest.partitions]
    if missing:
        raise BackupError(
            f"partition(s) {', '.join(map(str, missing))} are not in the backup at {url} "
            f"(it holds {', '.join(map(str, sorted(manifest.partitions))) or 'none'}); choose among those"
        )
    if to_txid is not None and to_txid < NO_TRANSACTION:
        raise BackupError(f"--to-txid must be -1 or more, got {to_txid}")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise BackupError(f"{directory} is not empty; restore into a new or empty directory")
    for p in wanted:
        entry = manifest.partitions[p]
        if to_txid is not None and entry.records and to_txid < entry.first_txid - 1:
            raise BackupError(
                f"partition {p}: the backup starts at transaction {entry.first_txid}, "
                f"--to-txid {to_txid} is before it"
            )
    bounds = {} if retention_from is None else _retention_bounds(retention_from, manifest.cluster_key)
    summary = RestoreSummary(
        url,
        str(directory),
        manifest.sequence,
        segment_size_bytes=segment_size_bytes,
        retention_bounds_read=retention_from is not None,
    )
    # The data files only: the node gets indexes of its own segments.
    names = [seg for p in wanted for seg in manifest.partitions[p].segments]
    problems: list[str] = []
    directory.mkdir(parents=True, exist_ok=True)
    # Everything is built in a scratch directory beside the target, and moves in once whole.
    with tempfile.TemporaryDirectory(prefix=".restoring-", dir=directory) as scratch_name:
        scratch = Path(scratch_name)
        downloads, built = scratch / "backup", scratch / "store"
        for name in names:
            if fetch_checked(store, manifest, name, downloads / name, problems):
                summary.bytes += manifest.files[name].size
            summary.files += 1
            if progress is not None:
                progress(summary.files, len(names))
        _raise_damaged(problems)
        built.mkdir()
        with StorageManager(
            built,
            manifest.cluster_key,
            manifest.num_partitions,
            segment_size_threshold_bytes=segment_size_bytes,
        ) as manager:
            manager.set_partition_assignment(wanted, True)
            for p in wanted:
                entry = manifest.partitions[p]
                last = entry.last_txid if to_txid is None else min(entry.last_txid, to_txid)
                bound = bounds.get(p, 0)
                partition = manager.partition(p)
                _rewrite(
                    partition, [downloads / name for name in entry.segments], entry.first_txid, bound, last
                )
                session_id = RESTORED_SESSION_ID if session_ids is None else session_ids[p]
                partition.set_low_water_mark(session_id, last)
                summary.partitions[p] = {"first_txid": partition.first_transaction_id(), "last_txid": last}
                shutil.rmtree(downloads / str(p), ignore_errors=True)
            manager.set_partition_available(wanted, True)
        for built_entry in sorted(built.iterdir()):
            built_entry.rename(directory / built_entry.name)
    return summary


def _retention_bounds(settings: ZooKeeperSettings, key: uuid.UUID) -> dict[int, int]:
    """Partition → effective retention bound of the cluster ``settings`` name, the backup's."""
    with connect(settings) as client:
        params = read_store_params(client, settings.cluster_root)
        if params.key != key:
            raise BackupError(
                f"the cluster at {settings.cluster_root} (key {params.key}) is not the backup's (key {key}): "
                "give the configuration of a node of the backup's cluster"
            )
        return read_effective_bounds(client, settings.cluster_root, params.num_partitions)


def _raise_damaged(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BackupError(
            f"the backup is damaged, nothing restored: {problems[0]}{more}; "
            "run 'waltz backup verify' for the whole list"
        )


def _rewrite(partition: Partition, segments: Sequence[Path], first: int, bound: int, last: int) -> None:
    """Append the backup's records from ``max(first, bound)`` up to ``last`` to the empty
    ``partition`` (its log begun there), each record checked as it is read."""
    begin = min(max(first, bound), last + 1)
    if begin > 0:
        partition.start_at(begin)
    batch: list[Record] = []
    batch_bytes = 0
    expected = first
    for path in segments:
        with SegmentReader(path) as reader:
            for item in reader.scan():
                if isinstance(item, SegmentProblem):
                    if item.kind in _INDEX_PROBLEMS:
                        continue  # the backup's index is not used: the node writes its own
                    _raise_damaged([f"{path.parent.name}/{path.name}: {item.message}"])
                    continue
                record = item.record.record
                if record.transaction_id != expected:
                    _raise_damaged(
                        [
                            f"{path.parent.name}/{path.name}: transaction {record.transaction_id} where "
                            f"{expected} was due"
                        ]
                    )
                expected += 1
                if record.transaction_id > last:
                    break
                if record.transaction_id < begin:
                    continue
                batch.append(record)
                batch_bytes += len(record.data)
                if len(batch) >= REWRITE_BATCH_RECORDS or batch_bytes >= REWRITE_BATCH_BYTES:
                    partition.append(batch)
                    batch, batch_bytes = [], 0
        if expected > last:
            break
    if batch:
        partition.append(batch)
    if partition.max_transaction_id() != last:
        _raise_damaged(
            [
                f"partition {partition.partition_id}: the manifest says transactions up to {last}, the "
                f"segments hold up to {expected - 1}"
            ]
        )
