"""Copying a partition's records from one node to another (the original's
``StorageRecoveryRunnable``), refilling the destination's damaged segments on the way, and
checksums of a stopped node's replicas.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from waltz_engine.common.address import HostPort
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.admin_ops.layout import (
    DEFAULT_RECOVERY_BATCH_SIZE,
    MAX_RECOVERY_BATCH_SIZE,
    NO_TRANSACTION,
    RECOVERY_MAX_ATTEMPTS,
    RECOVERY_RETRY_BACKOFF_MS,
    StorageAdminError,
    StorageContext,
)
from waltz_engine.storage.admin_ops.operations import (
    NodeCallFailure,
    admin_client,
    call_node,
    damaged_segments,
    data_client,
    starts_late,
)
from waltz_engine.storage.client import StorageClient
from waltz_engine.storage.constants import CONTROL_FILE_NAME
from waltz_engine.storage.damage import SegmentDamage
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.zk.partition_ranges import format_partition_ranges
from waltz_engine.zk.retention import retained_start_in

# --- recovery --------------------------------------------------------------------------------


class RecoveryProgress(NamedTuple):
    partition_id: int
    start: int  # the destination's max txid after truncation to its low-water mark
    current: int  # the destination's max txid (and low-water mark) now
    target: int  # the source's local low-water mark when the recovery began

    @property
    def fraction(self) -> float:
        span = self.target - self.start
        return 1.0 if span <= 0 else (self.current - self.start) / span


class RecoveryResult(NamedTuple):
    partition_id: int
    destination_session_id: int
    start: int
    target: int
    final: int
    records_copied: int
    attempts: int
    # Records sent to replace the destination's damaged segments (issue 13; not in the original).
    records_refilled: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "destination_session_id": self.destination_session_id,
            "start": self.start,
            "target": self.target,
            "max_transaction_id": self.final,
            "records_copied": self.records_copied,
            "attempts": self.attempts,
            "records_refilled": self.records_refilled,
        }


def check_batch_size(batch_size: int) -> int:
    if not 0 < batch_size <= MAX_RECOVERY_BATCH_SIZE:
        raise StorageAdminError(
            f"Batch size must be a positive integer up to {MAX_RECOVERY_BATCH_SIZE}, got {batch_size}"
        )
    return batch_size


@dataclass
class _RecoveryState:
    target: int | None = None
    start: int | None = None
    session_id: int = NO_TRANSACTION
    copied: int = 0
    refilled: int = 0
    # Awaited with each batch's data size in bytes: a caller's bound on the copy rate.
    throttle: Callable[[int], Awaitable[None]] | None = None
    # Only the damaged segments are refilled, nothing is cut or copied (see recover_partition).
    refill_only: bool = False
    # The cut may remove records the source cannot give back (see recover_partition).
    cut_above_source: bool = False
    # Copy up to here rather than the source's local low-water mark, if higher (recover_partition).
    up_to: int | None = None
    # The retained start the destination's log was begun at (retention removed what is below).
    started_late: int | None = None


# How a storage node of ours words its refusal to begin an empty log above its retention bound
# (``PartitionWorker._start_late``).
_RETENTION_BOUND_REFUSAL = "above the highest retention bound"


class _Gap(NamedTuple):
    """The destination holds up to ``current``; the source holds from ``retained_start`` on."""

    partition_id: int
    current: int
    retained_start: int
    source: HostPort
    destination: HostPort

    def describe(self) -> str:
        return (
            f"transactions {self.current + 1}..{self.retained_start - 1} of partition {self.partition_id} "
            f"are gone from the source {self.source} (removed by retention: its log starts at "
            f"{self.retained_start})"
        )


async def _start_at_retained_start(
    destination: StorageContext, destination_admin: StorageAdminClient, gap: _Gap, state: _RecoveryState
) -> int:
    """Make the destination go on at the source's retained start; the txid to copy after.

    Only our storage nodes can begin a log above 0, and only an empty one: a destination that
    holds records below the gap is emptied first (and the attempt starts over) where that is
    allowed (it is no assigned replica: ``cut_above_source``), never where its records may
    count toward a quorum."""
    p = gap.partition_id
    metrics = await call_node(
        destination, f"metrics request to {gap.destination}", destination_admin.metrics()
    )
    if not starts_late(metrics):
        raise NodeCallFailure(
            f"{gap.describe()}, and the destination {gap.destination} cannot begin a log there: it "
            "is not a Waltz for Python storage node (a Java 0.13.2 node holds every transaction from "
            "0). Copy to one of ours",
            transient=False,
        )
    if gap.current >= 0:
        if not state.cut_above_source:
            raise NodeCallFailure(
                f"{gap.describe()}; the destination {gap.destination} holds transactions up to "
                f"{gap.current}, and copying on would leave a gap. Empty its copy first (waltz storage "
                f"remove-partition -p {p} --delete-storage-files, then add-partition) or copy from a "
                "replica that still holds them",
                transient=False,
            )
        await _empty_destination(destination, destination_admin, gap.destination, p)
    state.started_late = gap.retained_start
    return gap.retained_start - 1


async def _empty_destination(
    destination: StorageContext, admin: StorageAdminClient, address: HostPort, partition_id: int
) -> NoReturn:
    """Delete a destination's copy that is no assigned replica (``cut_above_source``) and
    cannot be cut to fit, assign it again empty and offline; the attempt then starts over (the
    new copy has a session of its own)."""
    what = f"emptying the copy of partition {partition_id} on {address}"
    await call_node(destination, what, admin.set_partition_assignment([partition_id], False, True))
    await call_node(destination, what, admin.set_partition_assignment([partition_id], True, False))
    await call_node(destination, what, admin.set_partition_available([partition_id], False))
    raise NodeCallFailure(f"{what}: done, starting over", transient=True)


def _check_cut(partition_id: int, low_water_mark: int, highest: int, target: int) -> None:
    """Refuse a cut that removes records the source will not copy back: above the destination's
    low-water mark they may still be committed copies a quorum needs."""
    if highest <= max(low_water_mark, target):
        return
    raise NodeCallFailure(
        f"the destination holds transactions up to {highest} and its low-water mark is "
        f"{low_water_mark}, but the copy from the source goes only up to {target}: "
        f"the cut would remove {max(low_water_mark, target) + 1}..{highest}, which may be committed. "
        "Run again once the source has caught up (or copy from a replica that has), use "
        "--refill-only to repair damaged segments only, or --force to cut anyway",
        transient=False,
    )


async def _recover_once(
    source: StorageContext,
    destination: StorageContext,
    source_admin_address: HostPort,
    destination_admin_address: HostPort,
    destination_data_port: int,
    partition_id: int,
    batch_size: int,
    state: _RecoveryState,
    progress: Callable[[RecoveryProgress], None],
) -> int:
    data_address = HostPort(destination_admin_address.host, destination_data_port)
    async with (
        admin_client(source, source_admin_address) as source_admin,
        admin_client(destination, destination_admin_address) as destination_admin,
        data_client(destination, data_address, used_by_offline_recovery=True) as destination_data,
    ):
        info = await call_node(
            destination,
            f"last session info request to {destination_admin_address}",
            destination_admin.last_session_info(partition_id),
        )
        session_id = state.session_id = info.session_id
        highest = await call_node(
            destination,
            f"max transaction id request to {data_address}",
            destination_data.max_transaction_id(session_id, partition_id),
        )
        if state.target is None:
            # Fixed at the first start, as the original: re-run to catch up further.
            source_info = await call_node(
                source,
                f"last session info request to {source_admin_address}",
                source_admin.last_session_info(partition_id),
            )
            state.target = max(
                source_info.local_low_water_mark, NO_TRANSACTION if state.up_to is None else state.up_to
            )
        target = state.target
        if state.refill_only:
            current = highest
        else:
            if not state.cut_above_source:
                _check_cut(partition_id, info.low_water_mark, highest, target)
            try:
                current = await call_node(
                    destination,
                    f"truncating {data_address} to its low-water mark {info.low_water_mark}",
                    destination_data.truncate(session_id, partition_id, info.low_water_mark),
                )
            except NodeCallFailure as e:
                # Files kept from an earlier time as a replica, whose head retention removed:
                # its low-water mark (reset when it was unassigned) is below its own start.
                if retained_start_in(str(e)) is None or not state.cut_above_source:
                    raise
                await _empty_destination(
                    destination, destination_admin, destination_admin_address, partition_id
                )
        if state.start is None:
            state.start = current
        await _refill_damaged(
            _Refill(source, destination, source_admin, destination_admin, destination_data),
            source_admin_address,
            destination_admin_address,
            partition_id,
            session_id,
            min(current, target) if state.refill_only else current,
            batch_size,
            state,
        )
        if state.refill_only:
            return current
        progress(RecoveryProgress(partition_id, state.start, current, target))
        while current < target:
            count = min(target - current, batch_size)
            try:
                records = await call_node(
                    source,
                    f"record list request to {source_admin_address}",
                    source_admin.record_list(partition_id, current + 1, count),
                )
            except NodeCallFailure as e:
                retained_start = retained_start_in(str(e))
                if retained_start is None or retained_start <= current + 1:
                    raise
                # Retention removed the head on the source: the copy begins at its retained start.
                gap = _Gap(
                    partition_id, current, retained_start, source_admin_address, destination_admin_address
                )
                current = await _start_at_retained_start(destination, destination_admin, gap, state)
                if retained_start > target:
                    break
                continue
            if not records:
                raise NodeCallFailure(
                    f"source {source_admin_address} returned no record at transaction {current + 1} "
                    f"(it was to be copied up to {target})",
                    transient=False,
                )
            try:
                await call_node(
                    destination,
                    f"append to {data_address}",
                    destination_data.append(session_id, partition_id, records),
                )
            except NodeCallFailure as e:
                if state.started_late is None or _RETENTION_BOUND_REFUSAL not in str(e):
                    raise
                raise NodeCallFailure(
                    f"{e}. Transactions 0..{state.started_late - 1} are gone from the source "
                    f"(removed by retention) and the destination does not know of a retention bound "
                    f"that allows its log to begin at {state.started_late}: they went under a bound set "
                    f"before the highest bound was recorded, or the node could not read ZooKeeper "
                    f"(see its log). Set it (waltz retention set -p {partition_id} --before "
                    f"{state.started_late}) and run again",
                    transient=False,
                ) from None
            current += len(records)
            await call_node(
                destination,
                f"setting the low-water mark of {data_address} to {current}",
                destination_data.set_low_water_mark(session_id, partition_id, current),
            )
            state.copied += len(records)
            progress(RecoveryProgress(partition_id, state.start, current, target))
            if state.throttle is not None:
                # The bytes moved: each record whole (its header and checksums), not only its data.
                await state.throttle(sum(RECORD_OVERHEAD_BYTES + len(r.data) for r in records))
        return current


async def recover_partition(
    context: StorageContext,
    source_admin_address: HostPort,
    destination_admin_address: HostPort,
    destination_data_port: int,
    partition_id: int,
    *,
    batch_size: int = DEFAULT_RECOVERY_BATCH_SIZE,
    source_ssl_context: ssl.SSLContext | None = None,
    destination_ssl_context: ssl.SSLContext | None = None,
    progress: Callable[[RecoveryProgress], None] = lambda _: None,
    throttle: Callable[[int], Awaitable[None]] | None = None,
    refill_only: bool = False,
    cut_above_source: bool = False,
    up_to: int | None = None,
) -> RecoveryResult:
    """Copy a partition from a source node to a destination whose copy is offline (unavailable).

    As ``StorageRecoveryRunnable``: destination admin LAST_SESSION_INFO → (session, lwm);
    destination data client in offline-recovery mode; MAX_TRANSACTION_ID; TRUNCATE to the lwm;
    target = the source's local low-water mark; then RECORD_LIST from the source admin port →
    APPEND → SET_LOW_WATER_MARK, batch by batch. A lost connection or a timeout restarts from
    the destination's last low-water mark, up to ``RECOVERY_MAX_ATTEMPTS`` runs in all.

    ``refill_only`` repairs rot and nothing else: the damaged segments are refilled up to the
    source's local low-water mark, and nothing is cut. The cut to the low-water mark removes
    records that may be committed copies a quorum still needs: on a live cluster whose other
    replica lags (back from a crash), it left one copy of them, and the next recovery voted them
    away (the smoke run, seed 72: 522 committed transactions replaced). So a destination holding
    records above both its low-water mark and what the source copies is refused unless
    ``cut_above_source`` (the original tool's behaviour; safe where the destination is not an
    assigned replica).

    ``up_to`` copies further than the source's local low-water mark, which moves only when a
    store session starts: to a txid the caller knows committed and held by the source (the
    servers' committed high-water mark, the source's session current: see network_reader).
    """
    context.check_partitions([partition_id])
    check_batch_size(batch_size)
    source = replace(context, ssl_context=source_ssl_context or context.ssl_context)
    destination = replace(context, ssl_context=destination_ssl_context or context.ssl_context)
    state = _RecoveryState(
        throttle=throttle, refill_only=refill_only, cut_above_source=cut_above_source, up_to=up_to
    )
    backoff_ms = RECOVERY_RETRY_BACKOFF_MS
    for attempt in range(1, RECOVERY_MAX_ATTEMPTS + 1):
        try:
            final = await _recover_once(
                source,
                destination,
                source_admin_address,
                destination_admin_address,
                destination_data_port,
                partition_id,
                batch_size,
                state,
                progress,
            )
        except NodeCallFailure as e:
            if not e.transient or attempt == RECOVERY_MAX_ATTEMPTS:
                tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                raise StorageAdminError(f"Partition {partition_id} failed to recover{tries}. {e}") from None
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms *= 2
            continue
        assert state.target is not None and state.start is not None
        return RecoveryResult(
            partition_id,
            state.session_id,
            state.start,
            state.target,
            final,
            state.copied,
            attempt,
            state.refilled,
        )
    raise AssertionError("unreachable: the last attempt returns or raises")


class _Refill(NamedTuple):
    source: StorageContext
    destination: StorageContext
    source_admin: StorageAdminClient
    destination_admin: StorageAdminClient
    destination_data: StorageClient


async def _refill_damaged(
    nodes: _Refill,
    source_address: HostPort,
    destination_address: HostPort,
    partition_id: int,
    session_id: int,
    current: int,
    batch_size: int,
    state: _RecoveryState,
) -> None:
    """Send every record of each damaged segment the destination holds (up to ``current``) from
    the source, in order: the destination writes a copy and swaps it in after the last record,
    checking each record it holds whole against the one sent (see ``storage/refill.py``)."""

    async def damaged() -> list[SegmentDamage]:
        metrics = await call_node(
            nodes.destination,
            f"metrics request to {destination_address}",
            nodes.destination_admin.metrics(),
        )
        found = damaged_segments(metrics, partition_id, destination_address)
        return [d for d in found if d.segment <= current]

    for segment in await damaged():
        last = min(segment.max_transaction_id, current)
        txid = segment.segment
        while txid <= last:
            records = await call_node(
                nodes.source,
                f"record list request to {source_address}",
                nodes.source_admin.record_list(partition_id, txid, min(batch_size, last - txid + 1)),
            )
            if not records:
                raise NodeCallFailure(
                    f"source {source_address} returned no record at transaction {txid} to refill "
                    f"segment {segment.segment}-{last} of {destination_address}",
                    transient=False,
                )
            await call_node(
                nodes.destination,
                f"refilling segment {segment.segment}-{last} of {destination_address}",
                nodes.destination_data.append(session_id, partition_id, records),
            )
            txid += len(records)
            state.refilled += len(records)
    still = await damaged() if state.refilled else []
    if still:
        raise NodeCallFailure(
            f"{destination_address} still reports damage after the refill: {still[0].describe()}",
            transient=False,
        )


# --- replica checksums ------------------------------------------------------------------------


class ReplicaChecksums(NamedTuple):
    """Per partition, the replica checksum; and what ``repair`` changed first (one line each)."""

    checksums: dict[int, int]
    repaired: list[str]


def replica_checksums(
    directory: Path,
    key: uuid.UUID,
    num_partitions: int,
    partition_ids: Sequence[int] | None = None,
    *,
    repair: bool = False,
) -> ReplicaChecksums:
    """Per partition, CRC-32 (signed, as Java) over every segment's bytes after its header.

    Equal values on two nodes mean equal copies. The node of ``directory`` must be stopped (its
    control file is locked while it runs). A check: the directory is opened read-only
    (``StorageManager.open_read_only``) and damage of any kind (a torn tail, an index that
    differs from the records, interrupted or missing files, rot) fails with one line naming it,
    before any checksum. ``repair``: first do what a node's start does (cut a torn tail, rebuild
    the index, clean interrupted files: the original's ``WaltzStorage.checksums`` did that
    silently); damage that remains (rot: refill it, ``recover-partition``) still fails.
    Default: every assigned partition.
    """
    if not (directory / CONTROL_FILE_NAME).is_file():
        raise StorageAdminError(f"{directory} is not a storage directory (no {CONTROL_FILE_NAME})")
    with StorageManager.open_read_only(directory, key, num_partitions) as manager:
        wanted = _wanted_partitions(manager, directory, partition_ids)
        findings = manager.findings()
        found = {p: lines for p, lines in findings.items() if p in wanted and lines}
        if not repair or not any(findings.values()):
            _refuse_damage(directory, found)
            return ReplicaChecksums({p: manager.partition(p).checksum() for p in wanted}, [])
        # A node's start repairs every assigned partition: so does --repair.
        repaired = [f"partition {p}: {line}" for p in findings for line in manager.partition(p).findings]
    StorageManager(directory, key, num_partitions).close()  # a node's start: what repairs
    with StorageManager.open_read_only(directory, key, num_partitions) as manager:
        _refuse_damage(directory, {p: x for p, x in manager.findings().items() if p in wanted and x})
        return ReplicaChecksums({p: manager.partition(p).checksum() for p in wanted}, repaired)


def _wanted_partitions(
    manager: StorageManager, directory: Path, partition_ids: Sequence[int] | None
) -> list[int]:
    assigned = manager.assigned_partition_ids()
    wanted = assigned if partition_ids is None else sorted(set(partition_ids))
    missing = [p for p in wanted if p not in assigned]
    if missing:
        raise StorageAdminError(
            f"partition {format_partition_ranges(missing)} is not assigned in {directory}"
        )
    return wanted


def _refuse_damage(directory: Path, found: dict[int, list[str]]) -> None:
    """One line naming the first damage found, and how many more there are (none: nothing)."""
    if not found:
        return
    partition, lines = next(iter(found.items()))
    more = sum(len(x) for x in found.values()) - 1
    also = f" (and {more} more: waltz inspect verify {directory})" if more else ""
    raise StorageAdminError(f"{directory}: partition {partition}: {lines[0]}{also}")
