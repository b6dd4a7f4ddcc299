"""Bugs planted one at a time by patching (never by a switch in product code), for
``test_sim_finds_planted_bugs``: historical ones put back the code as it was before its fix; the
kinds issue 32 asked the simulator to see (an acknowledgement before the sync, wrong bytes
served by a cache, a missing storage fence) are written as such a bug would be.

Run the full search (every plant over up to ``SEARCH_SEEDS`` seeds, the first finding seed of
each printed) with ``WALTZ_SIM_SEARCH=1 python -m pytest -q tests/sim/test_sim_finds_planted_bugs.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from plant_guard import Patch

from waltz_engine.client.client import WaltzClient
from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.common.reqid import ReqId
from waltz_engine.server.feeds import FeedClient
from waltz_engine.server.partition import _MOUNT, Partition
from waltz_engine.server.store.recovery import UNKNOWN_HIGH_WATER_MARK, RecoveryManager
from waltz_engine.server.transaction_cache import TransactionCache, TransactionData
from waltz_engine.sim.disk import SimDisk
from waltz_engine.sim.operator import Operator
from waltz_engine.storage import partition_head
from waltz_engine.storage.control_file import ConcurrentUpdateError
from waltz_engine.storage.node.failures import PartitionNotAssignedError
from waltz_engine.storage.node.partition_worker import _OFFLINE_CAPABLE, PartitionWorker
from waltz_engine.storage.partition import Partition as StoragePartition
from waltz_engine.storage.replica_mover import ReplicaMover
from waltz_engine.storage.segment import Segment
from waltz_engine.storage.tier.offload import TierOffloader
from waltz_engine.wire.client_messages import MountRequest

# A plant patches through a plant_guard.GuardedPatch (its replacements checked to fit).
Plant = Callable[[Patch], None]
# The plants' first findings lie within this many seeds (move_ends_unrecorded_unchecked's is 313: its
# window, right after a move returns, is short).
SEARCH_SEEDS = 400


def barrier_hole(monkeypatch: Patch) -> None:
    """Issue 21 item 1 before bc13b25: a raised generation keeps serving from the old store
    session (no reopen, no NOT_READY for a mount from a newer generation), and an append whose
    store future raised counts as decided."""

    async def set_generation(self: Partition, generation: int) -> None:
        if generation > self.generation:
            self.generation = generation
            await self.store.set_generation(generation)
            self._store_generation = generation  # the append task never reopens

    async def mount(self: Partition, client: FeedClient, request: MountRequest) -> None:
        req_id = request.req_id
        self._register(client, req_id.client_id, req_id.generation, request.seq_num)
        if self._is_valid(client, req_id.client_id):
            await self._queue.put((_MOUNT, client, request))

    def outcome_unknown(self: Partition, append_number: int, req_id: ReqId) -> None:
        self._barrier.decide(append_number)

    monkeypatch.setattr(Partition, "set_generation", set_generation)
    monkeypatch.setattr(Partition, "mount", mount)
    monkeypatch.setattr(Partition, "_outcome_unknown", outcome_unknown)


def forged_fence(monkeypatch: Patch) -> None:
    """Before 624b99e: every request, a read too, moved the node's fencing session id on receipt,
    to any id (none checked against ZooKeeper)."""

    async def submit(self: PartitionWorker, conn: Any, msg: Any) -> None:
        self.session_id = max(self.session_id, msg.session_id)
        await self._put((conn, msg))

    monkeypatch.setattr(PartitionWorker, "submit", submit)
    # Every request: the receipt path from the read callback (issue 33) goes through it too.
    monkeypatch.setattr(PartitionWorker, "submit_now", lambda self, conn, msg: False)


def retry_worker_dies(monkeypatch: Patch) -> None:
    """Before 05e9d3d: the retry worker caught only WaltzError, so an application error raised by
    a retried execute ended it and the retries after it waited forever."""

    async def retry_worker(self: WaltzClient) -> None:
        while True:
            # The queue's items as today's worker takes them (a context and its unsent retries):
            # the plant dies of an application error only, as the historical bug did, and not of
            # its own mistake on the first retry (an AttributeError that then escaped the
            # client's close and left the world's servers running after the seed).
            context, unsent_retries = await self._retry_queue.get()
            with contextlib.suppress(WaltzError):
                await self._attempt(context, unsent_retries)

    monkeypatch.setattr(WaltzClient, "_retry_worker", retry_worker)


def recovery_cuts_committed(monkeypatch: Patch) -> None:
    """A recovery that truncates below the low-water mark: it resolves one transaction below what
    its quorum reported, without 41bc83b's refusal to cut a replica below its low-water mark."""
    resolve, set_resolved = RecoveryManager._resolve, RecoveryManager._set_resolved

    async def resolve_unguarded(
        self: RecoveryManager, replica_id: Any, connection: Any, voting: bool, high: int, low: int
    ) -> None:
        await resolve(self, replica_id, connection, voting, high, UNKNOWN_HIGH_WATER_MARK)

    def set_resolved_low(self: RecoveryManager, high_water_mark: int) -> None:
        set_resolved(self, max(UNKNOWN_HIGH_WATER_MARK, high_water_mark - 1))

    monkeypatch.setattr(RecoveryManager, "_resolve", resolve_unguarded)
    monkeypatch.setattr(RecoveryManager, "_set_resolved", set_resolved_low)


def ack_before_sync(monkeypatch: Patch) -> None:
    """A storage node that acknowledges an append before its data is synced: the segment's
    fdatasync after a batch is left out, and so is the whole-disk sync of a disk pass of several
    partitions (issue 33) (the data reaches the platter at the next checkpoint's fsync, or when
    the segment closes), so a power loss takes acknowledged records."""

    def unsynced(write: Callable[..., None]) -> Callable[..., None]:
        def write_unsynced(self: Segment, *args: Any) -> None:
            file = self._seg_file
            file.fdatasync = lambda: None  # type: ignore[method-assign]
            try:
                write(self, *args)
            finally:
                del file.fdatasync

        return write_unsynced

    monkeypatch.setattr(Segment, "_write", unsynced(Segment._write))
    # (Issue 33, fifth session: a lone append's record is written by ``append_record``, not ``_write``.)
    monkeypatch.setattr(Segment, "append_record", unsynced(Segment.append_record))
    monkeypatch.setattr(Segment, "sync_data", lambda self: None)
    monkeypatch.setattr(SimDisk, "sync_all", lambda self, directory: None)


def whole_disk_sync_skipped(monkeypatch: Patch) -> None:
    """Issue 33: a storage node whose disk pass of several partitions acknowledges their lone
    appends without the one whole-disk sync that was to make them durable (``syncfs`` left out;
    every file's own sync stays): a partition's records reach the platter only at its next own
    sync, so a power loss in between takes acknowledged records."""
    monkeypatch.setattr(SimDisk, "sync_all", lambda self, directory: None)


def cache_serves_wrong_bytes(monkeypatch: Patch) -> None:
    """A server's transaction cache that answers some hits with the previous transaction's entry
    (data and its checksum, so the client's CRC check passes): a stale slot served for a key."""
    get = TransactionCache.get

    def get_stale(self: TransactionCache, partition_id: int, transaction_id: int) -> TransactionData | None:
        found = get(self, partition_id, transaction_id)
        if found is not None and transaction_id % 5 == 4:
            return get(self, partition_id, transaction_id - 1) or found
        return found

    monkeypatch.setattr(TransactionCache, "get", get_stale)


def missing_storage_fence(monkeypatch: Patch) -> None:
    """A storage node that no longer refuses a request of a session older than its own: a
    deposed server's late appends are written (the original's checkPermissions without its
    ConcurrentUpdateException)."""

    def check_permissions(
        self: PartitionWorker, partition: StoragePartition | None, msg: Any
    ) -> StoragePartition:
        if partition is None:
            raise PartitionNotAssignedError(self.partition_id)
        info = partition.info.current
        if not info.assigned:
            raise StorageError(f"partition {self.partition_id} is not assigned to storage node.")
        if type(msg) in _OFFLINE_CAPABLE and msg.used_by_offline_recovery:
            if info.available:
                raise StorageError("cannot run offline recovery while partition is online")
            if msg.session_id != info.session_id:
                raise StorageError(f"partition last session id has changed to {info.session_id}")
        else:
            if not info.available:
                raise StorageError(f"read and write for partition={self.partition_id} have been disabled")
            if msg.session_id > self.session_id:
                raise ConcurrentUpdateError(f"session id {msg.session_id} is not opened on this replica")
        return partition

    monkeypatch.setattr(PartitionWorker, "_check_permissions", check_permissions)


PLANTS: dict[str, Plant] = {
    "barrier_hole": barrier_hole,
    "forged_fence": forged_fence,
    "retry_worker_dies": retry_worker_dies,
    "recovery_cuts_committed": recovery_cuts_committed,
    "ack_before_sync": ack_before_sync,
    "whole_disk_sync_skipped": whole_disk_sync_skipped,
    "cache_serves_wrong_bytes": cache_serves_wrong_bytes,
    "missing_storage_fence": missing_storage_fence,
}


def retention_past_low_water_mark(monkeypatch: Patch) -> None:
    """A retention bound that removes uncommitted records: the cleaner removes the head segments
    wholly below the bound without the local low-water mark's limit (records above it may be a
    dead session's, never committed)."""

    def removable(segments: Sequence[tuple[int, int]], bound: int, local_low_water_mark: int) -> int:
        count = 0
        for _, max_transaction_id in segments[:-1]:
            if max_transaction_id >= bound:
                break
            count += 1
        return count

    monkeypatch.setattr(partition_head, "removable_head_segments", removable)


def move_drops_tail(monkeypatch: Patch) -> None:
    """A replica move that drops the tail (before 7dfa44a, and without the catch-up wait): the
    copy goes only up to the source's local low-water mark, and the source leaves the assignment
    at once, before the target holds the transactions committed meanwhile."""

    async def committed_on(self: ReplicaMover, layout: Any, storage: str, p: int) -> int | None:
        return None

    async def await_caught_up(self: ReplicaMover, layout: Any, move: Any) -> None:
        return None

    monkeypatch.setattr(ReplicaMover, "_committed_on", committed_on)
    monkeypatch.setattr(ReplicaMover, "_await_caught_up", await_caught_up)
    # At once: nor does it wait for a store session to record the target (the later bare-quorum
    # rule, which else holds the source until the servers' recovery has caught the target up).
    monkeypatch.setattr(ReplicaMover, "_await_recorded_quorum", await_caught_up)

    async def await_removal_recorded(self: ReplicaMover, move: Any) -> None:
        return None

    # Nor does it wait, once the source is out, for a session to record the replicas without it
    # (the later rule of the operator's day, which else ends the move only once the servers'
    # recovery of that session has caught the target up).
    monkeypatch.setattr(ReplicaMover, "_await_removal_recorded", await_removal_recorded)


def move_ends_unrecorded(monkeypatch: Patch) -> None:
    """A move that ends (and tells its source) as soon as the source is out of the assignment
    (before the operator's day of 2026-11-28): the servers' recovery of the session without it
    has not recorded the replicas that stay, and one of them lost then stalls the log."""

    async def await_removal_recorded(self: ReplicaMover, move: Any) -> None:
        return None

    monkeypatch.setattr(ReplicaMover, "_await_removal_recorded", await_removal_recorded)


def offload_unsealed(monkeypatch: Patch) -> None:
    """An offload of an unsealed segment: the tier's round uploads the partition's current
    segment too once its records are at or below the local low-water mark (appends go on into
    it after the upload, and the manifest names a copy that is no longer the segment)."""
    offload = TierOffloader._offload

    def offload_current(self: TierOffloader, partition: StoragePartition, bound: int | None) -> None:
        segments = partition.segments
        if segments and segments[-1][1] <= partition.info.current.local_low_water_mark:
            self.attach(partition)
            manifest = self._manifest(partition.partition_id)
            first, last = segments[-1]
            if first not in manifest.segments and self._records_whole(partition, first, last):
                manifest.add(self._upload(partition, manifest.prefix, first, last))
        offload(self, partition, bound)

    monkeypatch.setattr(TierOffloader, "_offload", offload_current)


def move_ends_unrecorded_unchecked(monkeypatch: Patch) -> None:
    """``move_ends_unrecorded`` with the decommission's own check of ZooKeeper's replicas of
    record left out: only what follows shows it, a replica that stays lost for good right after
    the command returned, and the log stalled with a quorum of its replicas of record up (the
    liveness check's finding)."""
    move_ends_unrecorded(monkeypatch)

    async def check_recorded_without(self: Operator, move: Any) -> None:
        return None

    monkeypatch.setattr(Operator, "_check_recorded_without", check_recorded_without)


PLANTS.update(
    {
        "retention_past_low_water_mark": retention_past_low_water_mark,
        "move_drops_tail": move_drops_tail,
        "move_ends_unrecorded": move_ends_unrecorded,
        "move_ends_unrecorded_unchecked": move_ends_unrecorded_unchecked,
        "offload_unsealed": offload_unsealed,
    }
)
