"""What the simulated world checks after a seed (:class:`waltz_engine.sim.world.SimWorld`'s
``check``, ``check_replicas`` and ``export_read``, kept apart for size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from waltz_engine.sim.replicas import check_replicas as check_replica_records
from waltz_engine.sim.replicas import export_read as export_read_replica
from waltz_engine.sim.workload import check_outcomes
from waltz_engine.sim.world_constants import OPERATOR_HOST, STORAGE_ADMIN_PORT
from waltz_engine.storage.admin_client import StorageAdminClient

if TYPE_CHECKING:
    from waltz_engine.sim.world import SimWorld


def check(world: SimWorld) -> list[str]:
    """Every outcome against the log, and the bank's ledger (and with ``acl``: nothing of the
    refused partitions was committed or delivered)."""
    violations = check_outcomes(world.application, world.contexts, world.incarnation)
    if world.shape.acl:
        for partition_id in (world.shape.partitions - 2, world.shape.partitions - 1):
            delivered = world.application.applied.get(partition_id, [])
            if delivered:
                violations.append(
                    f"partition {partition_id}: the ACLs refuse it, yet {len(delivered)} delivered"
                )
    violations += world.liveness.violations
    violations += world.acknowledged.violations
    return violations + world.forged_served + world.close_failures + world.ledger.violations


def check_replicas(world: SimWorld) -> list[str]:
    """The storage nodes' records against the client's log and data (while the nodes run)."""
    violations: list[str] = []
    damaged = None if world.damaged_host is None else int(world.damaged_host.rsplit("-", 1)[1])
    for partition_id in range(world.shape.partitions):
        committed = world.application.applied.get(partition_id, [])
        # With the operator's actions, the replicas are the nodes ZooKeeper assigns now
        # (what the partition's quorum counts), moved or recovered ones included.
        operated = world.shape.operator_actions
        nodes = world.operator.assigned_nodes(partition_id) if operated else world.storage
        damaged = next((i for i, node in enumerate(nodes) if node.config.host == world.damaged_host), None)
        lost = world.operator.assigned_gone(partition_id) if operated else 0
        violations += check_replica_records(nodes, partition_id, committed, world.payloads, damaged, lost)
    if world.shape.operator_actions:
        world.operator.check_retained()
        violations += world.operator.violations + world.operator.check_tier()
        violations += world.operator.check_replica_count()
    return violations


async def export_read(world: SimWorld) -> list[str]:
    """The committed range as an export reads it from each replica's admin port (records,
    their headers, data and checksums): what is served must be what the client built, from
    the replica's retained start on (below it, retention removed the records: not served)."""
    violations: list[str] = []
    for number, node in enumerate(world.storage):
        if number in world.gone:
            continue  # lost for good: nothing to read
        host = node.config.host
        admin = StorageAdminClient(
            host,
            STORAGE_ADMIN_PORT,
            None,
            world.key,
            world.shape.partitions,
            network=world.network.node(OPERATOR_HOST),
        )
        await admin.open()
        try:
            for partition_id in range(world.shape.partitions):
                if node.manager is None or partition_id not in node.manager.assigned_partition_ids():
                    continue  # not (or no longer) a replica of it
                committed = world.application.applied.get(partition_id, [])
                violations += await export_read_replica(admin, host, partition_id, committed, world.payloads)
        finally:
            await admin.close()
    return violations
