"""Pure unit tests: every znode payload the Java original wrote decodes and re-encodes exactly."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from testkit import read_jsonl

from waltz_engine.zk.java_io import JavaFormatError
from waltz_engine.zk.paths import ClusterPaths, ClusterRootError, normalize_root
from waltz_engine.zk.payloads import (
    ClusterParams,
    GroupDescriptor,
    PartitionAssignment,
    PartitionMetadata,
    ReplicaId,
    ReplicaState,
    StoreParams,
    decode_payload,
)

VECTOR_ROOT = "/vectors"
VECTOR_KEY = uuid.UUID("dad1ea14-6351-4aca-a2fd-ba73d70294b2")


def _records(vectors: Path) -> list[dict[str, Any]]:
    records = read_jsonl(vectors / "zk" / "znodes.jsonl")
    assert {r["moment"] for r in records} == {"a", "b", "c0", "c", "d", "e"}
    return records


def test_every_vector_payload_decodes_and_reencodes(vectors: Path) -> None:
    kinds_seen = set()
    for record in _records(vectors):
        if "kind" not in record:
            continue
        data = bytes.fromhex(record["hex"])
        payload = decode_payload(record["kind"], data)
        assert payload.to_json() == record["decoded"], record["path"]
        assert payload.to_bytes() == data, record["path"]
        kinds_seen.add(record["kind"])
    assert len(kinds_seen) == 9


def test_every_vector_path_maps_to_its_kind(vectors: Path) -> None:
    paths = ClusterPaths.of(VECTOR_ROOT)
    for record in _records(vectors):
        assert paths.kind_of(record["path"]) == record.get("kind"), record["path"]
        if "kind" not in record:
            assert record["data_null"] is True


def test_payload_constructors_give_the_vector_bytes() -> None:
    assert ClusterParams("vectors", 4).to_bytes().hex() == "b4e87347010007766563746f727300000004"
    assert PartitionAssignment.initial().to_bytes().hex() == "03ffffffff0000000000000000"
    assert StoreParams(VECTOR_KEY, 4).to_bytes().hex() == "01dad1ea1463514acaa2fdba73d70294b200000004"
    assert PartitionMetadata.empty() == PartitionMetadata(-1, -1, ())


def test_partition_metadata_map_round_trip_keeps_java_order(vectors: Path) -> None:
    for record in _records(vectors):
        if record.get("kind") != "PartitionMetadata":
            continue
        metadata = PartitionMetadata.from_bytes(bytes.fromhex(record["hex"]))
        rebuilt = PartitionMetadata.of_map(metadata.generation, metadata.session_id, metadata.states_map())
        assert rebuilt.to_bytes().hex() == record["hex"], record["path"]


def test_replica_state_unresolved_and_str() -> None:
    state = ReplicaState(ReplicaId(2, "h:1"), 0, -(1 << 63))
    assert state.is_unresolved
    assert str(state.replica_id) == "ReplicaId(2,h:1)"


@pytest.mark.parametrize(
    ("kind", "hex_data", "message"),
    [
        ("ClusterParams", "00000000010000", "magic"),
        ("ClusterParams", "b4e87347020000", "version 2"),
        ("StoreParams", "01dad1ea14", "truncated"),
        ("StoreParams", "01dad1ea1463514acaa2fdba73d70294b20000000400", "trailing"),
        ("PartitionAssignment", "01", "version 1"),
        ("GroupDescriptor", "0100000009", "impossible element count"),
        ("PartitionMetadata", "01" + "00000001" + "00" * 8 + "00000001" + "02" + "00" * 23, "version 2"),
        ("Integer", "000000", "truncated"),
    ],
)
def test_malformed_payloads_are_refused(kind: str, hex_data: str, message: str) -> None:
    with pytest.raises(JavaFormatError, match=message):
        decode_payload(kind, bytes.fromhex(hex_data))


def test_group_descriptor_of_map_copies_like_java() -> None:
    descriptor = GroupDescriptor((("b:1", 0), ("a:1", 1)))
    assert GroupDescriptor.of_map(descriptor.as_map()).as_dict() == {"b:1": 0, "a:1": 1}


@pytest.mark.parametrize("root", ["", "/", "relative", "/a//b", "/a/./b"])
def test_bad_cluster_roots_are_refused(root: str) -> None:
    with pytest.raises(ClusterRootError):
        normalize_root(root)


def test_cluster_root_trailing_slash_is_dropped() -> None:
    assert ClusterPaths.of("/waltz/").admin_lock == "/waltz/store/adminLock"
