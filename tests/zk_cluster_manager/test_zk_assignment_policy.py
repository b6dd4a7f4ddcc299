"""Pure unit tests of the partition assignment policy (the original's DynamicPartitionAssignmentPolicy)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testkit import read_jsonl

from waltz_engine.zk.assignment_policy import (
    AssignmentPolicyError,
    effective_forced,
    honours_forced,
    in_java_order,
    partitions_of,
    update,
)
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import (
    ForcedAssignments,
    PartitionAssignment,
    PartitionInfo,
    ServerDescriptor,
    ServerPartitions,
)

MAX_PARTITIONS = 24
MAX_SERVERS = 6
MAX_SERVER_ID = 40  # above 16 so ids collide in HashMap buckets
ROUNDS = 4


def _server(server_id: int, preferred: tuple[int, ...] = ()) -> ServerDescriptor:
    return ServerDescriptor(server_id, "localhost", 5000 + server_id, preferred)


def _owners(assignment: PartitionAssignment) -> dict[int, int]:
    return {info.partition_id: s.server_id for s in assignment.servers for info in s.partitions}


def _generations(assignment: PartitionAssignment) -> dict[int, int]:
    return {info.partition_id: info.generation for s in assignment.servers for info in s.partitions}


def _loads(assignment: PartitionAssignment) -> dict[int, int]:
    return {s.server_id: len(s.partitions) for s in assignment.servers}


def _vector_assignment(vectors: Path, moment: str) -> PartitionAssignment:
    for record in read_jsonl(vectors / "zk" / "znodes.jsonl"):
        if record["moment"] == moment and record["path"] == "/vectors/serverDescriptors":
            return PartitionAssignment.from_bytes(bytes.fromhex(record["hex"]))
    raise AssertionError(f"no assignment at moment {moment}")


def test_first_assignment_gives_generation_one() -> None:
    result = update(4, PartitionAssignment.initial(), [_server(1)], {}, random.Random(0), cversion=1)
    assert result.cversion == 1 and result.num_partitions == 4
    assert sorted(partitions_of(result, 1)) == [PartitionInfo(p, 1) for p in range(4)]


def test_restart_reproduces_vector_moments_c_to_d_to_e(vectors: Path) -> None:
    """Server 1 (moment c) replaced by server 2: all moved, generation 2; preferring 1,3 moves nothing."""
    moment_c, moment_d, moment_e = (_vector_assignment(vectors, m) for m in ("c", "d", "e"))
    after_restart = update(4, moment_c, [_server(2)], {}, random.Random(0), cversion=3)
    assert _owners(after_restart) == _owners(moment_d) and _generations(after_restart) == _generations(
        moment_d
    )
    preferred = update(4, moment_d, [_server(2, (1, 3))], {}, random.Random(0), cversion=3)
    assert _owners(preferred) == _owners(moment_e) and _generations(preferred) == _generations(moment_e)
    assert preferred.cversion == moment_e.cversion


def test_second_server_takes_half_and_only_moved_partitions_change_generation() -> None:
    first = update(6, PartitionAssignment.initial(), [_server(1)], {}, random.Random(0), cversion=1)
    second = update(6, first, [_server(1), _server(2)], {}, random.Random(0), cversion=2)
    assert _loads(second) == {1: 3, 2: 3}
    for partition_id, owner in _owners(second).items():
        assert _generations(second)[partition_id] == (1 if owner == 1 else 2)


def test_remainder_goes_to_the_first_servers_to_reach_the_minimum() -> None:
    """5 partitions, 2 servers: server 2 fills up first through its preferred partitions, so it gets 3."""
    result = update(
        5,
        PartitionAssignment.initial(),
        [_server(1), _server(2, (0, 1, 2))],
        {},
        random.Random(0),
        cversion=1,
    )
    assert sorted(info.partition_id for info in partitions_of(result, 2)) == [0, 1, 2]
    assert sorted(info.partition_id for info in partitions_of(result, 1)) == [3, 4]


def test_same_preferred_partition_goes_to_the_first_server_in_java_order() -> None:
    servers = [_server(17, (0,)), _server(3, (0,))]  # HashMap<Integer> visits 17 (bucket 1) before 3
    assert in_java_order([3, 17]) == [17, 3]
    result = update(2, PartitionAssignment.initial(), servers, {}, random.Random(0), cversion=1)
    assert [s.server_id for s in result.servers] == [17, 3]
    assert _owners(result)[0] == 17


def test_payload_lists_servers_in_the_order_of_the_copied_java_hashmap() -> None:
    """``new PartitionAssignment`` copies the map into a table of 4 for 2 servers: 4 (bucket 0) before 1."""
    result = update(
        2, PartitionAssignment.initial(), [_server(1), _server(4)], {}, random.Random(0), cversion=1
    )
    assert [s.server_id for s in result.servers] == [4, 1]


def test_preferred_partitions_beyond_the_quota_are_not_taken() -> None:
    result = update(
        4,
        PartitionAssignment.initial(),
        [_server(1, (0, 1, 2, 3)), _server(2)],
        {},
        random.Random(0),
        cversion=1,
    )
    assert _loads(result) == {1: 2, 2: 2}


def test_forced_partitions_go_to_their_server_regardless_of_spread() -> None:
    first = update(
        4, PartitionAssignment.initial(), [_server(1), _server(2)], {}, random.Random(0), cversion=2
    )
    forced = {0: 2, 1: 2, 2: 2}
    result = update(4, first, [_server(1, (0, 1)), _server(2)], forced, random.Random(0), cversion=2)
    assert _owners(result) == {0: 2, 1: 2, 2: 2, 3: 1}
    assert honours_forced(result, forced, [1, 2])
    assert not honours_forced(first, forced, [1, 2])
    for partition_id, owner in _owners(result).items():
        moved = _owners(first)[partition_id] != owner
        assert _generations(result)[partition_id] == _generations(first)[partition_id] + moved


def test_forced_assignment_to_an_absent_server_or_partition_does_not_bind() -> None:
    assert effective_forced({0: 9, 1: 2, 7: 2}, [1, 2], num_partitions=4) == {1: 2}
    result = update(
        4, PartitionAssignment.initial(), [_server(1), _server(2)], {0: 9}, random.Random(0), cversion=1
    )
    assert _loads(result) == {1: 2, 2: 2}


def test_no_servers_gives_an_empty_assignment() -> None:
    result = update(4, PartitionAssignment.initial(), [], {}, random.Random(0), cversion=5)
    assert result == PartitionAssignment(5, 4, ())


def test_decreasing_the_partition_count_is_refused() -> None:
    first = update(4, PartitionAssignment.initial(), [_server(1)], {}, random.Random(0), cversion=1)
    with pytest.raises(AssignmentPolicyError, match="decreasing"):
        update(3, first, [_server(1)], {}, random.Random(0), cversion=2)


def test_an_assignment_missing_partitions_is_refused() -> None:
    broken = PartitionAssignment(1, 3, (ServerPartitions(1, (PartitionInfo(0, 1),)),))
    with pytest.raises(AssignmentPolicyError, match="cover"):
        update(3, broken, [_server(1)], {}, random.Random(0), cversion=2)


def test_new_partitions_join_with_generation_one() -> None:
    first = update(2, PartitionAssignment.initial(), [_server(1)], {}, random.Random(0), cversion=1)
    grown = update(4, first, [_server(1)], {}, random.Random(0), cversion=1)
    assert _generations(grown) == {0: 1, 1: 1, 2: 1, 3: 1}


def test_forced_assignments_payload_layout() -> None:
    """Our extension's znode: int8 version 1, int32 count, (partition, server) pairs by partition."""
    payload = ForcedAssignments.of({3: 2, 1: 5})
    assert payload.to_bytes().hex() == "010000000200000001000000050000000300000002"
    assert ForcedAssignments.from_bytes(payload.to_bytes()).as_dict() == {1: 5, 3: 2}
    assert ClusterPaths.of("/c").kind_of("/c/forcedAssignments") == "ForcedAssignments"


# --- properties -------------------------------------------------------------------------------

membership_st = st.lists(
    st.tuples(
        st.integers(1, MAX_SERVER_ID),
        st.lists(st.integers(0, MAX_PARTITIONS - 1), max_size=4, unique=True).map(tuple),
    ),
    min_size=0,
    max_size=MAX_SERVERS,
    unique_by=lambda entry: entry[0],
)
forced_st = st.dictionaries(st.integers(0, MAX_PARTITIONS - 1), st.integers(1, MAX_SERVER_ID), max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    num_partitions=st.integers(0, MAX_PARTITIONS),
    rounds=st.lists(st.tuples(membership_st, forced_st), min_size=1, max_size=ROUNDS),
    seed=st.integers(0, 2**32 - 1),
)
def test_policy_properties_over_membership_changes(
    num_partitions: int, rounds: list[tuple[list[tuple[int, tuple[int, ...]]], dict[int, int]]], seed: int
) -> None:
    rng = random.Random(seed)
    current = PartitionAssignment.initial()
    for cversion, (membership, forced) in enumerate(rounds):
        servers = [_server(server_id, preferred) for server_id, preferred in membership]
        result = update(num_partitions, current, servers, forced, rng, cversion=cversion)
        assert result.cversion == cversion and result.num_partitions == num_partitions
        if not servers:
            assert result.servers == ()
            continue  # the original keeps the stale assignment in ZooKeeper; so do we
        assert sorted(s.server_id for s in result.servers) == sorted(d.server_id for d in servers)
        assigned = [info.partition_id for s in result.servers for info in s.partitions]
        assert sorted(assigned) == list(range(num_partitions)), "every partition exactly once"

        live = [d.server_id for d in servers]
        binding = effective_forced(forced, live, num_partitions)
        assert honours_forced(result, forced, live)
        loads = _loads(result)
        forced_counts = Counter(binding.values())
        receiving = [load for server_id, load in loads.items() if load > forced_counts[server_id]]
        if receiving:
            assert max(receiving) <= min(loads.values()) + 1, "spread within 1 except forced"
        if not binding:
            assert max(loads.values()) - min(loads.values()) <= 1

        old_owners, old_generations = _owners(current), _generations(current)
        for partition_id, generation in _generations(result).items():
            if partition_id not in old_owners:
                assert generation == 1, "brand-new partitions start at 0, so first assignment gives 1"
            elif old_owners[partition_id] == _owners(result)[partition_id]:
                assert generation == old_generations[partition_id], "unmoved keeps its generation"
            else:
                assert generation == old_generations[partition_id] + 1, "moved gets +1"
        current = result
