"""Codecs for every znode payload under a cluster root (reference §2.2, vectors ``zk/``).

Each payload type keeps its entries in the order they are stored, so decoding then encoding
gives back the same bytes. Writers that build a map-shaped payload from scratch go through
:func:`storage_map` / ``of_map`` so the order is ``java.util.HashMap``'s, as the original's.
``to_json`` gives the shape of the vectors' ``decoded`` field.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from waltz_engine.disk.file_header import uuid_from_bits, uuid_to_bits
from waltz_engine.zk.java_io import (
    INT64_MIN,
    DataReader,
    DataWriter,
    JavaFormatError,
    JavaHashMap,
    java_string_hash,
    to_int32,
)

CLUSTER_PARAMS_MAGIC = java_string_hash("Cluster Manager")
CLUSTER_PARAMS_VERSION = 1
PARTITION_ASSIGNMENT_VERSION = 3
SERVER_DESCRIPTOR_VERSION = 1
STORE_METADATA_VERSION = 1  # StoreParams, PartitionMetadata, ReplicaState, ReplicaId and the three maps
FORCED_ASSIGNMENTS_VERSION = 1  # our extension (issue #6 of the original); Java servers never read it

UNRESOLVED_HIGH_WATER_MARK = INT64_MIN  # ReplicaState.UNRESOLVED = Long.MIN_VALUE

# Smallest encoded size of one element, so a garbage count is rejected before looping on it.
_INT_SIZE_BYTES = 4
_PARTITION_INFO_SIZE_BYTES = 8
_SERVER_ENTRY_MIN_SIZE_BYTES = 8
_MAP_ENTRY_MIN_SIZE_BYTES = 6  # empty UTF (2) + int32
_REPLICA_STATE_MIN_SIZE_BYTES = 24


class Payload(Protocol):
    def to_bytes(self) -> bytes: ...

    def to_json(self) -> Any: ...


def _check_version(reader: DataReader, expected: int, what: str) -> None:
    version = reader.read_int8()
    if version != expected:
        raise JavaFormatError(f"{what} has unsupported version {version} (expected {expected})")


def _finish(reader: DataReader) -> DataReader:
    reader.expect_end()
    return reader


class ClusterParams(NamedTuple):
    """``<root>``: the cluster's name and partition count (zktools ``ClusterParamsSerializer``)."""

    name: str
    num_partitions: int

    def to_bytes(self) -> bytes:
        writer = DataWriter().write_int32(CLUSTER_PARAMS_MAGIC).write_int8(CLUSTER_PARAMS_VERSION)
        return writer.write_utf(self.name).write_int32(self.num_partitions).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ClusterParams:
        reader = DataReader(data, "cluster parameters")
        magic = reader.read_int32()
        if magic != CLUSTER_PARAMS_MAGIC:
            raise JavaFormatError(f"cluster parameters have a wrong magic number {magic:#x}")
        _check_version(reader, CLUSTER_PARAMS_VERSION, "cluster parameters")
        result = cls(reader.read_utf(), reader.read_int32())
        _finish(reader)
        return result

    def to_json(self) -> Any:
        return {"name": self.name, "numPartitions": self.num_partitions}


class PartitionInfo(NamedTuple):
    partition_id: int
    generation: int


class ServerPartitions(NamedTuple):
    server_id: int
    partitions: tuple[PartitionInfo, ...]


class PartitionAssignment(NamedTuple):
    """``<root>/serverDescriptors``: the coordinator's server → partitions assignment (version 3)."""

    cversion: int
    num_partitions: int
    servers: tuple[ServerPartitions, ...]

    @classmethod
    def initial(cls) -> PartitionAssignment:
        """What ``new PartitionAssignment()`` holds when a cluster is created."""
        return cls(cversion=-1, num_partitions=0, servers=())

    @property
    def num_endpoints(self) -> int:
        return len(self.servers)

    def to_bytes(self) -> bytes:
        writer = DataWriter().write_int8(PARTITION_ASSIGNMENT_VERSION)
        writer.write_int32(self.cversion).write_int32(self.num_partitions).write_int32(len(self.servers))
        for server in self.servers:
            writer.write_int32(server.server_id).write_int32(len(server.partitions))
            for info in server.partitions:
                writer.write_int32(info.partition_id).write_int32(info.generation)
        return writer.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionAssignment:
        reader = DataReader(data, "partition assignment")
        _check_version(reader, PARTITION_ASSIGNMENT_VERSION, "partition assignment")
        cversion, num_partitions = reader.read_int32(), reader.read_int32()
        servers = []
        for _ in range(reader.read_count(_SERVER_ENTRY_MIN_SIZE_BYTES)):
            server_id = reader.read_int32()
            count = reader.read_count(_PARTITION_INFO_SIZE_BYTES)
            infos = tuple(PartitionInfo(reader.read_int32(), reader.read_int32()) for _ in range(count))
            servers.append(ServerPartitions(server_id, infos))
        _finish(reader)
        return cls(cversion, num_partitions, tuple(servers))

    def to_json(self) -> Any:
        return {
            "cversion": self.cversion,
            "numPartitions": self.num_partitions,
            "numEndpoints": self.num_endpoints,
            "servers": [
                {
                    "serverId": server.server_id,
                    "partitions": [
                        {"partitionId": info.partition_id, "generation": info.generation}
                        for info in server.partitions
                    ],
                }
                for server in self.servers
            ],
        }


class ServerDescriptor(NamedTuple):
    """``<root>/serverDescriptors/s_NNNNNNNNNN`` (ephemeral sequential): one live server."""

    server_id: int
    host: str
    port: int
    preferred_partitions: tuple[int, ...]

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def to_bytes(self) -> bytes:
        writer = DataWriter().write_int8(SERVER_DESCRIPTOR_VERSION).write_int32(self.server_id)
        writer.write_utf(self.host).write_int32(self.port).write_int32(len(self.preferred_partitions))
        for partition_id in self.preferred_partitions:
            writer.write_int32(partition_id)
        return writer.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ServerDescriptor:
        reader = DataReader(data, "server descriptor")
        _check_version(reader, SERVER_DESCRIPTOR_VERSION, "server descriptor")
        server_id, host, port = reader.read_int32(), reader.read_utf(), reader.read_int32()
        count = reader.read_count(_INT_SIZE_BYTES)
        preferred = tuple(reader.read_int32() for _ in range(count))
        _finish(reader)
        return cls(server_id, host, port, preferred)

    def to_json(self) -> Any:
        return {
            "serverId": self.server_id,
            "host": self.host,
            "port": self.port,
            "preferredPartitions": list(self.preferred_partitions),
        }


class IdCounter(NamedTuple):
    """``<root>/ids/client`` and ``<root>/ids/server``: the last id handed out (int32)."""

    value: int

    def to_bytes(self) -> bytes:
        return DataWriter().write_int32(self.value).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> IdCounter:
        reader = DataReader(data, "id counter")
        result = cls(reader.read_int32())
        _finish(reader)
        return result

    def to_json(self) -> Any:
        return self.value


class StoreParams(NamedTuple):
    """``<root>/store``: the cluster key every storage file carries, and the partition count."""

    key: uuid.UUID
    num_partitions: int

    def to_bytes(self) -> bytes:
        msb, lsb = uuid_to_bits(self.key)
        writer = DataWriter().write_int8(STORE_METADATA_VERSION).write_int64(msb).write_int64(lsb)
        return writer.write_int32(self.num_partitions).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> StoreParams:
        reader = DataReader(data, "store parameters")
        _check_version(reader, STORE_METADATA_VERSION, "store parameters")
        msb, lsb = reader.read_int64(), reader.read_int64()
        result = cls(uuid_from_bits(msb, lsb), reader.read_int32())
        _finish(reader)
        return result

    def to_json(self) -> Any:
        return {"key": str(self.key), "numPartitions": self.num_partitions}


class ReplicaId(NamedTuple):
    partition_id: int
    storage: str  # the storage node's data connect string, host:port

    def java_hash(self) -> int:
        """``ReplicaId.hashCode()`` = partitionId × storage.hashCode() (int32)."""
        return to_int32(self.partition_id * java_string_hash(self.storage))

    def __str__(self) -> str:
        return f"ReplicaId({self.partition_id},{self.storage})"


class ReplicaState(NamedTuple):
    replica_id: ReplicaId
    session_id: int
    closing_high_water_mark: int

    @property
    def is_unresolved(self) -> bool:
        return self.closing_high_water_mark == UNRESOLVED_HIGH_WATER_MARK

    def write_to(self, writer: DataWriter) -> None:
        writer.write_int8(STORE_METADATA_VERSION).write_int8(STORE_METADATA_VERSION)
        writer.write_int32(self.replica_id.partition_id).write_utf(self.replica_id.storage)
        writer.write_int64(self.session_id).write_int64(self.closing_high_water_mark)

    @classmethod
    def read_from(cls, reader: DataReader) -> ReplicaState:
        _check_version(reader, STORE_METADATA_VERSION, "replica state")
        _check_version(reader, STORE_METADATA_VERSION, "replica id")
        replica_id = ReplicaId(reader.read_int32(), reader.read_utf())
        return cls(replica_id, reader.read_int64(), reader.read_int64())


class PartitionMetadata(NamedTuple):
    """``<root>/store/partition/<id>``: generation, store session and replica states (CAS-updated)."""

    generation: int
    session_id: int
    replica_states: tuple[ReplicaState, ...]

    @classmethod
    def empty(cls) -> PartitionMetadata:
        """``PartitionMetadata.EMPTY``: what a partition without a znode is taken to hold."""
        return cls(generation=-1, session_id=-1, replica_states=())

    @classmethod
    def of_map(
        cls, generation: int, session_id: int, states: JavaHashMap[ReplicaId, ReplicaState]
    ) -> PartitionMetadata:
        """``new PartitionMetadata(generation, sessionId, map)``, which copies the map."""
        copy = JavaHashMap.copy_of(states)
        return cls(generation, session_id, tuple(state for _, state in copy.items()))

    def latest_recorded_storages(self) -> set[str] | None:
        """The storage nodes recorded in the latest store session a recovery recorded; None when
        none is (no replica state, or only replicas that never were in a session).

        A session's recovery records every replica it caught up at that session (the quorum-th
        first, then each one that ends later); a replica left at an earlier session did not catch
        up in it. While a new session's recovery runs no replica is at its id yet, and the latest
        recorded session is still the one whose replicas hold the history: the reference is the
        highest session id among the states, not ``session_id``.
        """
        latest = max((state.session_id for state in self.replica_states), default=-1)
        if latest < 0:
            return None
        return {state.replica_id.storage for state in self.replica_states if state.session_id == latest}

    def states_map(self) -> JavaHashMap[ReplicaId, ReplicaState]:
        """The map ``PartitionMetadata.readFrom`` builds, to modify and write back."""
        return JavaHashMap.from_items(ReplicaId.java_hash, ((s.replica_id, s) for s in self.replica_states))

    def to_bytes(self) -> bytes:
        writer = DataWriter().write_int8(STORE_METADATA_VERSION).write_int32(self.generation)
        writer.write_int64(self.session_id).write_int32(len(self.replica_states))
        for state in self.replica_states:
            state.write_to(writer)
        return writer.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionMetadata:
        reader = DataReader(data, "partition metadata")
        _check_version(reader, STORE_METADATA_VERSION, "partition metadata")
        generation, session_id = reader.read_int32(), reader.read_int64()
        count = reader.read_count(_REPLICA_STATE_MIN_SIZE_BYTES)
        states = tuple(ReplicaState.read_from(reader) for _ in range(count))
        _finish(reader)
        return cls(generation, session_id, states)

    def to_json(self) -> Any:
        return {
            "generation": self.generation,
            "sessionId": self.session_id,
            "replicaStates": [
                {
                    "partitionId": state.replica_id.partition_id,
                    "storageNodeConnectString": state.replica_id.storage,
                    "sessionId": state.session_id,
                    "closingHighWaterMark": state.closing_high_water_mark,
                    "closingHighWaterMarkIsUnresolved": state.is_unresolved,
                }
                for state in self.replica_states
            ],
        }


def storage_map(entries: Iterable[tuple[str, Any]]) -> JavaHashMap[str, Any]:
    """A ``HashMap<String, …>`` filled in order, as the storage-keyed payloads' ``readFrom`` does."""
    return JavaHashMap.from_items(java_string_hash, entries)


def _read_storage_entries(
    data: bytes, what: str, read_value: Callable[[DataReader], Any]
) -> tuple[tuple[str, Any], ...]:
    reader = DataReader(data, what)
    _check_version(reader, STORE_METADATA_VERSION, what)
    entries = []
    for _ in range(reader.read_count(_MAP_ENTRY_MIN_SIZE_BYTES)):
        storage = reader.read_utf()
        entries.append((storage, read_value(reader)))
    _finish(reader)
    return tuple(entries)


def _write_storage_entries(
    entries: tuple[tuple[str, Any], ...], write_value: Callable[[DataWriter, Any], None]
) -> bytes:
    writer = DataWriter().write_int8(STORE_METADATA_VERSION).write_int32(len(entries))
    for storage, value in entries:
        writer.write_utf(storage)
        write_value(writer, value)
    return writer.to_bytes()


def _read_int_list(reader: DataReader) -> tuple[int, ...]:
    count = reader.read_count(_INT_SIZE_BYTES)
    return tuple(reader.read_int32() for _ in range(count))


def _write_int_list(writer: DataWriter, values: tuple[int, ...]) -> None:
    writer.write_int32(len(values))
    for value in values:
        writer.write_int32(value)


def _write_int(writer: DataWriter, value: int) -> None:
    writer.write_int32(value)


def _read_int(reader: DataReader) -> int:
    return reader.read_int32()


class ReplicaAssignments(NamedTuple):
    """``<root>/store/assignment``: storage connect string → partition ids it holds."""

    replicas: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of_map(cls, replicas: JavaHashMap[str, tuple[int, ...]]) -> ReplicaAssignments:
        """``new ReplicaAssignments(map)``, which copies the map."""
        return cls(tuple(JavaHashMap.copy_of(replicas).items()))

    def as_map(self) -> JavaHashMap[str, tuple[int, ...]]:
        return storage_map(self.replicas)

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return dict(self.replicas)

    def to_bytes(self) -> bytes:
        return _write_storage_entries(self.replicas, _write_int_list)

    @classmethod
    def from_bytes(cls, data: bytes) -> ReplicaAssignments:
        return cls(_read_storage_entries(data, "replica assignments", _read_int_list))

    def to_json(self) -> Any:
        return [
            {"storageNodeConnectString": storage, "partitionIds": list(partitions)}
            for storage, partitions in self.replicas
        ]


class GroupDescriptor(NamedTuple):
    """``<root>/store/group``: storage connect string → group id."""

    groups: tuple[tuple[str, int], ...]

    @classmethod
    def of_map(cls, groups: JavaHashMap[str, int]) -> GroupDescriptor:
        return cls(tuple(JavaHashMap.copy_of(groups).items()))

    def as_map(self) -> JavaHashMap[str, int]:
        return storage_map(self.groups)

    def as_dict(self) -> dict[str, int]:
        return dict(self.groups)

    def to_bytes(self) -> bytes:
        return _write_storage_entries(self.groups, _write_int)

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupDescriptor:
        return cls(_read_storage_entries(data, "group descriptor", _read_int))

    def to_json(self) -> Any:
        return [{"storageNodeConnectString": storage, "groupId": group} for storage, group in self.groups]


class ConnectionMetadata(NamedTuple):
    """``<root>/store/connection``: storage connect string → its admin port."""

    connections: tuple[tuple[str, int], ...]

    @classmethod
    def of_map(cls, connections: JavaHashMap[str, int]) -> ConnectionMetadata:
        return cls(tuple(JavaHashMap.copy_of(connections).items()))

    def as_map(self) -> JavaHashMap[str, int]:
        return storage_map(self.connections)

    def as_dict(self) -> dict[str, int]:
        return dict(self.connections)

    def to_bytes(self) -> bytes:
        return _write_storage_entries(self.connections, _write_int)

    @classmethod
    def from_bytes(cls, data: bytes) -> ConnectionMetadata:
        return cls(_read_storage_entries(data, "connection metadata", _read_int))

    def to_json(self) -> Any:
        return [
            {"storageNodeConnectString": storage, "adminPort": port} for storage, port in self.connections
        ]


class ForcedAssignments(NamedTuple):
    """``<root>/forcedAssignments`` (our extension): partition → the server id it must go to.

    ``version:int8 = 1, n:int32, n × (partitionId:int32, serverId:int32)``, ascending partition
    ids, so equal contents are equal bytes.
    """

    assignments: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, assignments: dict[int, int]) -> ForcedAssignments:
        return cls(tuple(sorted(assignments.items())))

    def as_dict(self) -> dict[int, int]:
        return dict(self.assignments)

    def to_bytes(self) -> bytes:
        writer = DataWriter().write_int8(FORCED_ASSIGNMENTS_VERSION).write_int32(len(self.assignments))
        for partition_id, server_id in self.assignments:
            writer.write_int32(partition_id).write_int32(server_id)
        return writer.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ForcedAssignments:
        reader = DataReader(data, "forced assignments")
        _check_version(reader, FORCED_ASSIGNMENTS_VERSION, "forced assignments")
        count = reader.read_count(_PARTITION_INFO_SIZE_BYTES)
        result = cls(tuple((reader.read_int32(), reader.read_int32()) for _ in range(count)))
        _finish(reader)
        return result

    def to_json(self) -> Any:
        return [{"partitionId": partition, "serverId": server} for partition, server in self.assignments]


# The vectors' `kind` names → decoders.
PAYLOAD_KINDS: dict[str, Callable[[bytes], Payload]] = {
    "ClusterParams": ClusterParams.from_bytes,
    "PartitionAssignment": PartitionAssignment.from_bytes,
    "ServerDescriptor": ServerDescriptor.from_bytes,
    "Integer": IdCounter.from_bytes,
    "StoreParams": StoreParams.from_bytes,
    "PartitionMetadata": PartitionMetadata.from_bytes,
    "ReplicaAssignments": ReplicaAssignments.from_bytes,
    "GroupDescriptor": GroupDescriptor.from_bytes,
    "ConnectionMetadata": ConnectionMetadata.from_bytes,
    "ForcedAssignments": ForcedAssignments.from_bytes,
}


def decode_payload(kind: str, data: bytes) -> Payload:
    assert kind in PAYLOAD_KINDS, f"unknown payload kind {kind}"
    return PAYLOAD_KINDS[kind](data)
