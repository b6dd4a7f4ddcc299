"""Which partitions have fewer caught-up replicas than assigned, and why (issue 24 item 3).

A replica counts when its node answers, holds the partition assigned and available, has no
damaged segment, holds every transaction committed when the check began (the committed
high-water marks are asked from the servers first, then every replica, so a healthy replica is
never reported behind), and ZooKeeper records it in the partition's latest recorded store
session (``recovering`` until then: a replica just moved in holds the log before the server's
recovery records it, and until it does the partition's history rests on the earlier session's
replicas; losing one of them then stalls the partition, so this is the check to wait for before
taking another holder down). Everything is read through the original's messages (admin METRICS and
LAST_SESSION_INFO, data MAX_TRANSACTION_ID, the client protocol's high-water mark): Java nodes
answer too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from waltz_engine.common.address import HostPort, parse_host_port
from waltz_engine.common.errors import WaltzError
from waltz_engine.ops.cluster_ops.view import ClusterView
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import PartitionStatus, StorageContext
from waltz_engine.storage.network_reader import ClusterAccess, committed_high_water_marks
from waltz_engine.zk.payloads import PartitionMetadata

OK = "ok"


@dataclass(frozen=True)
class ReplicaState:
    storage: str
    state: str  # "ok", "down", "behind", "offline", "unassigned on the node", "damaged", "recovering"
    detail: str = ""

    @property
    def caught_up(self) -> bool:
        return self.state == OK

    def to_json(self) -> dict[str, object]:
        return {"storage": self.storage, "state": self.state, "detail": self.detail}


@dataclass
class PartitionReplication:
    partition_id: int
    committed: int  # the high-water mark the replicas were compared with
    replicas: list[ReplicaState] = field(default_factory=list)

    @property
    def caught_up(self) -> int:
        return sum(1 for r in self.replicas if r.caught_up)

    @property
    def under_replicated(self) -> bool:
        return self.caught_up < len(self.replicas)

    def to_json(self) -> dict[str, object]:
        return {
            "partition_id": self.partition_id,
            "committed_high_water_mark": self.committed,
            "assigned": len(self.replicas),
            "caught_up": self.caught_up,
            "missing": [r.to_json() for r in self.replicas if not r.caught_up],
        }


@dataclass
class ReplicationReport:
    partitions: list[PartitionReplication]

    @property
    def under_replicated(self) -> list[PartitionReplication]:
        return [p for p in self.partitions if p.under_replicated]

    def to_json(self) -> dict[str, object]:
        return {
            "partitions_checked": len(self.partitions),
            "under_replicated_count": len(self.under_replicated),
            "under_replicated": [p.to_json() for p in self.under_replicated],
        }


RECOVERING_DETAIL = "caught up; the server's recovery has not recorded it yet"


async def _node_states(
    context: StorageContext,
    storage: str,
    admin_port: int,
    partitions: Sequence[int],
    committed: dict[int, int],
    recorded: dict[int, set[str] | None],
) -> dict[int, ReplicaState]:
    """The state of each of ``partitions`` on one node."""
    try:
        data = parse_host_port(storage)
        admin = HostPort(data.host, admin_port)
        statuses = {
            s.partition_id: s for s in (await admin_ops.list_partitions(context, admin, storage)).partitions
        }
    except (WaltzError, OSError, TimeoutError) as e:
        return {p: ReplicaState(storage, "down", str(e) or type(e).__name__) for p in partitions}
    states = {}
    for p in partitions:
        status = statuses.get(p)
        state = await _replica_state(context, storage, admin, data.port, p, status, committed.get(p, -1))
        held_by = recorded.get(p)
        if state.caught_up and held_by is not None and storage not in held_by:
            state = ReplicaState(storage, "recovering", RECOVERING_DETAIL)
        states[p] = state
    return states


async def _replica_state(
    context: StorageContext,
    storage: str,
    admin: HostPort,
    data_port: int,
    partition_id: int,
    status: PartitionStatus | None,
    committed: int,
) -> ReplicaState:
    if status is None or not status.is_assigned:
        return ReplicaState(
            storage, "unassigned on the node", "ZooKeeper assigns it; the node does not hold it"
        )
    if not status.is_available:
        return ReplicaState(storage, "offline", "the partition is unavailable on the node")
    if status.damaged:
        return ReplicaState(storage, "damaged", f"{len(status.damaged)} damaged segment(s)")
    try:
        held = await admin_ops.max_transaction_id(context, admin, data_port, partition_id, offline=False)
    except (WaltzError, OSError, TimeoutError) as e:
        return ReplicaState(storage, "down", str(e) or type(e).__name__)
    if held < committed:
        return ReplicaState(storage, "behind", f"behind by {committed - held} (holds to {held})")
    return ReplicaState(storage, OK)


async def replication_report(
    view: ClusterView, context: StorageContext, access: ClusterAccess, partitions: Sequence[int] | None = None
) -> ReplicationReport:
    """Every (wanted) partition's assigned replicas and whether each is caught up."""
    wanted = list(range(view.num_partitions)) if partitions is None else list(partitions)
    committed = await asyncio.to_thread(committed_high_water_marks, access, wanted)  # first the bound
    recorded = {p: _recorded(view.partition_metadata.get(p)) for p in wanted}
    report = {p: PartitionReplication(p, committed.get(p, -1)) for p in wanted}
    by_node = {
        storage: [p for p in ids if p in report] for storage, ids in sorted(view.replica_assignments.items())
    }
    answers = await asyncio.gather(
        *(
            _node_states(context, storage, view.storage_admin_ports[storage], ids, committed, recorded)
            if storage in view.storage_admin_ports
            else _no_admin_port(storage, ids)
            for storage, ids in by_node.items()
        )
    )
    for states in answers:
        for p, state in states.items():
            report[p].replicas.append(state)
    return ReplicationReport(list(report.values()))


def _recorded(metadata: PartitionMetadata | None) -> set[str] | None:
    return None if metadata is None else metadata.latest_recorded_storages()


async def _no_admin_port(storage: str, partitions: Sequence[int]) -> dict[int, ReplicaState]:
    return {
        p: ReplicaState(storage, "down", "no admin port in ZooKeeper (store/connection)") for p in partitions
    }
