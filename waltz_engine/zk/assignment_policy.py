"""Which server owns which partition: zktools ``DynamicPartitionAssignmentPolicy.update`` (§2.3).

The original's phases, in its order: preferred partitions, then partitions a server already
owns, then the leftovers, each bounded by an even-spread quota (``numPartitions // numServers``,
the first servers to reach it taking the ``numPartitions % numServers`` extra ones). A
partition keeps its generation while it stays on its server and gets +1 whenever it moves or
comes from the pool; brand-new partitions enter the pool at generation 0.

Our extension (the original's issue #6): *forced* assignments ``partition -> server id``,
placed before everything else when that server is alive. The forced partitions count towards
their server's load and the rest is water-filled around them, so without forced assignments
the quotas are exactly the original's.

Servers are visited in ``java.util.HashMap<Integer, …>`` order, as the original iterates its
membership map; partition lists are shuffled with the caller's ``rng`` (Java's order is random
and need not be reproduced, only the payload format).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from waltz_engine.common.errors import WaltzError
from waltz_engine.zk.java_io import JavaHashMap, to_int32
from waltz_engine.zk.payloads import PartitionAssignment, PartitionInfo, ServerDescriptor, ServerPartitions

NO_SERVER = -1  # previous owner of a brand-new partition (the original's partitionToExistingServerMap)
NEW_PARTITION_GENERATION = 0


class AssignmentPolicyError(WaltzError):
    """The assignment cannot be computed (fewer partitions than before, or a corrupt assignment)."""


def java_integer_hash(value: int) -> int:
    """``Integer.hashCode()``: the value itself."""
    return to_int32(value)


def in_java_order(server_ids: Iterable[int]) -> list[int]:
    """Server ids in the iteration order of a ``HashMap<Integer, …>`` filled in the given order."""
    return list(JavaHashMap.from_items(java_integer_hash, ((server_id, None) for server_id in server_ids)))


def effective_forced(
    forced: Mapping[int, int], live_server_ids: Iterable[int], num_partitions: int
) -> dict[int, int]:
    """The forced assignments that bind now: their server is alive and their partition exists."""
    live = set(live_server_ids)
    return {p: s for p, s in sorted(forced.items()) if s in live and 0 <= p < num_partitions}


def honours_forced(
    assignment: PartitionAssignment, forced: Mapping[int, int], live_server_ids: Iterable[int]
) -> bool:
    """Whether every binding forced partition sits on its forced server in ``assignment``."""
    owner = {info.partition_id: s.server_id for s in assignment.servers for info in s.partitions}
    binding = effective_forced(forced, live_server_ids, assignment.num_partitions)
    return all(owner.get(partition) == server for partition, server in binding.items())


def partitions_of(assignment: PartitionAssignment, server_id: int) -> tuple[PartitionInfo, ...]:
    """``PartitionAssignment.partitionsFor``: the server's partitions, none when it has no entry."""
    for server in assignment.servers:
        if server.server_id == server_id:
            return server.partitions
    return ()


class _Quota:
    """Per-server partition limits: a base, plus a shared pool of +1 slots taken first come."""

    def __init__(
        self, forced_counts: Mapping[int, int], server_ids: Sequence[int], free_partitions: int
    ) -> None:
        assert server_ids and free_partitions >= 0
        counts = [forced_counts.get(s, 0) for s in server_ids]
        # Water-filling: the highest level every server can be raised to with the free partitions.
        level = free_partitions // len(server_ids)
        while sum(max(0, level + 1 - count) for count in counts) <= free_partitions:
            level += 1
        self.level = level
        self.base = {s: max(count, level) for s, count in zip(server_ids, counts, strict=True)}
        self.extra = free_partitions - sum(max(0, level - count) for count in counts)
        # The loop stops only once some server sits at or below the level, so the extras fit.
        assert 0 <= self.extra < sum(1 for count in counts if count <= level)

    def admit(self, server_id: int, size: int) -> bool:
        """Whether ``server_id`` holding ``size`` partitions may take one more (consumes an extra slot)."""
        base = self.base[server_id]
        if size < base:
            return True
        if size == base and base == self.level and self.extra > 0:
            self.extra -= 1
            return True
        return False


def _moved_to(info: PartitionInfo, previous_owner: int, server_id: int) -> PartitionInfo:
    if previous_owner == server_id:
        return info
    return PartitionInfo(info.partition_id, info.generation + 1)


def update(
    num_partitions: int,
    current: PartitionAssignment,
    servers: Sequence[ServerDescriptor],
    forced: Mapping[int, int],
    rng: random.Random,
    *,
    cversion: int,
) -> PartitionAssignment:
    """The next assignment for the live ``servers``, stamped with the membership's ``cversion``."""
    if num_partitions < current.num_partitions:
        raise AssignmentPolicyError("decreasing the number of partitions is not allowed")
    descriptors = {d.server_id: d for d in servers}
    if len(descriptors) != len(servers):
        raise AssignmentPolicyError("two live server descriptors carry the same server id")
    if not servers:
        return PartitionAssignment(cversion, num_partitions, ())
    server_ids = in_java_order(d.server_id for d in servers)

    # The pool: every partition, with its previous owner; Java's HashMap order decides the leftovers' order.
    unassigned: dict[int, PartitionInfo] = {}
    previous_owner: dict[int, int] = {}
    pool_order: JavaHashMap[int, None] = JavaHashMap(java_integer_hash)
    new_partitions = (
        (PartitionInfo(p, NEW_PARTITION_GENERATION), NO_SERVER)
        for p in range(current.num_partitions, num_partitions)
    )
    old_partitions = ((info, s.server_id) for s in current.servers for info in s.partitions)
    for info, owner in (*new_partitions, *old_partitions):
        unassigned[info.partition_id] = info
        previous_owner[info.partition_id] = owner
        pool_order.put(info.partition_id, None)
    if set(unassigned) != set(range(num_partitions)):
        raise AssignmentPolicyError(
            f"the current assignment does not cover exactly partitions 0..{num_partitions - 1}"
        )

    binding = effective_forced(forced, server_ids, num_partitions)
    quota = _Quota(Counter(binding.values()), server_ids, num_partitions - len(binding))
    lists: dict[int, list[PartitionInfo]] = {s: [] for s in server_ids}

    for partition_id, server_id in binding.items():
        lists[server_id].append(
            _moved_to(unassigned.pop(partition_id), previous_owner[partition_id], server_id)
        )

    for server_id in server_ids:
        for partition_id in descriptors[server_id].preferred_partitions:
            if partition_id in unassigned and quota.admit(server_id, len(lists[server_id])):
                info = unassigned.pop(partition_id)
                lists[server_id].append(_moved_to(info, previous_owner[partition_id], server_id))

    owned_before = {s.server_id: s.partitions for s in current.servers}
    for server_id in server_ids:
        for info in owned_before.get(server_id, ()):
            if info.partition_id not in unassigned:
                continue
            if not quota.admit(server_id, len(lists[server_id])):
                break
            lists[server_id].append(unassigned.pop(info.partition_id))

    leftovers = [unassigned[p] for p in pool_order if p in unassigned]
    next_leftover = 0
    for server_id in server_ids:
        while next_leftover < len(leftovers) and quota.admit(server_id, len(lists[server_id])):
            info = leftovers[next_leftover]
            lists[server_id].append(PartitionInfo(info.partition_id, info.generation + 1))
            next_leftover += 1
    assert next_leftover == len(leftovers), "quotas add up to the partition count, so nothing is left"

    for server_id in server_ids:
        rng.shuffle(lists[server_id])
    # ``new PartitionAssignment(...)`` copies the map, which decides the servers' order in the payload.
    assigned = JavaHashMap.copy_of(JavaHashMap.from_items(java_integer_hash, lists.items()))
    result = PartitionAssignment(
        cversion, num_partitions, tuple(ServerPartitions(s, tuple(infos)) for s, infos in assigned.items())
    )
    assert sorted(info.partition_id for s in result.servers for info in s.partitions) == list(
        range(num_partitions)
    )
    return result
