"""Pure unit tests: DataOutputStream/writeUTF, String.hashCode and java.util.HashMap order."""

from __future__ import annotations

import pytest

from waltz_engine.zk.java_io import (
    UTF_MAX_SIZE_BYTES,
    DataReader,
    DataWriter,
    JavaFormatError,
    JavaHashMap,
    decode_modified_utf8,
    encode_modified_utf8,
    java_string_hash,
)
from waltz_engine.zk.payloads import CLUSTER_PARAMS_MAGIC, ReplicaId, storage_map


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("", ""),
        ("localhost:57280", b"localhost:57280".hex()),
        ("\x00", "c080"),  # never a single zero byte
        ("a\x00b", "61c08062"),
        ("\x7f", "7f"),
        ("\x80", "c280"),
        ("\u07ff", "dfbf"),
        ("\u0800", "e0a080"),
        ("\uffff", "efbfbf"),
        ("é", "c3a9"),
        ("\U0001f600", "eda0bdedb880"),  # surrogate pair, each half 3 bytes (standard UTF-8: f09f9880)
    ],
)
def test_write_utf_uses_modified_utf8(text: str, encoded: str) -> None:
    body = bytes.fromhex(encoded)
    assert encode_modified_utf8(text) == body
    written = DataWriter().write_utf(text).to_bytes()
    assert written == len(body).to_bytes(2, "big") + body
    reader = DataReader(written)
    assert reader.read_utf() == text
    reader.expect_end()


def test_write_utf_length_limit_is_in_bytes_not_chars() -> None:
    fits = "x" * UTF_MAX_SIZE_BYTES
    assert DataWriter().write_utf(fits).to_bytes()[:2] == b"\xff\xff"
    with pytest.raises(JavaFormatError, match="too long"):
        DataWriter().write_utf("é" * (UTF_MAX_SIZE_BYTES // 2 + 1))  # 2 bytes each


@pytest.mark.parametrize("body", ["80", "c0", "e0a0", "f09f9880", "c061"])
def test_read_utf_rejects_malformed_input(body: str) -> None:
    with pytest.raises(JavaFormatError, match="malformed"):
        decode_modified_utf8(bytes.fromhex(body))


def test_lone_surrogates_survive_a_round_trip() -> None:
    text = "\ud800x"
    assert decode_modified_utf8(encode_modified_utf8(text)) == text


def test_reader_rejects_truncation_trailing_bytes_and_impossible_counts() -> None:
    with pytest.raises(JavaFormatError, match="truncated"):
        DataReader(b"\x00\x00\x00").read_int32()
    reader = DataReader(b"\x00\x00\x00\x01\x02")
    reader.read_int32()
    with pytest.raises(JavaFormatError, match="trailing"):
        reader.expect_end()
    with pytest.raises(JavaFormatError, match="impossible element count"):
        DataReader(b"\x7f\xff\xff\xff").read_count(4)
    with pytest.raises(JavaFormatError, match="impossible element count"):
        DataReader(b"\xff\xff\xff\xff").read_count(4)


def test_java_string_hash_matches_known_java_values() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Cluster Manager") == -1259834553 == CLUSTER_PARAMS_MAGIC
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # hashed as two UTF-16 units


def _int_map(keys: list[int]) -> JavaHashMap[int, int]:
    return JavaHashMap.from_items(lambda k: k, ((k, k) for k in keys))


def test_hashmap_buckets_then_insertion_order() -> None:
    # 16 and 0 share bucket 0 of a 16-slot table: insertion order decides within it.
    assert list(_int_map([16, 5, 0, 1])) == [16, 0, 1, 5]


def test_hashmap_resizes_when_size_exceeds_three_quarters() -> None:
    twelve = _int_map([16, *range(1, 12)])
    assert twelve.capacity() == 16
    assert list(twelve)[0] == 16  # still in bucket 0
    thirteen = _int_map([16, *range(1, 13)])
    assert thirteen.capacity() == 32
    assert list(thirteen) == [*range(1, 13), 16]  # 16 moved to bucket 16


def test_hashmap_spreads_high_bits() -> None:
    # h ^ (h >>> 16): 0x10000 lands in bucket 1, ahead of 2.
    assert list(_int_map([2, 0x10000])) == [0x10000, 2]


def test_hashmap_copy_constructor_sizes_from_source() -> None:
    three = _int_map([9, 1])
    three.put(3, 3)
    assert three.capacity() == 16
    assert list(three) == [1, 3, 9]
    copy = JavaHashMap.copy_of(three)
    assert copy.capacity() == 8  # tableSizeFor(3 / 0.75 + 1) = 8: 9 and 1 now share bucket 1
    assert list(copy) == [1, 9, 3]
    assert JavaHashMap.copy_of(_int_map(list(range(12)))).capacity() == 32
    assert JavaHashMap.copy_of(_int_map([])).capacity() == 0


def test_hashmap_replace_keeps_position_and_remove_keeps_others() -> None:
    mapping = _int_map([16, 0, 1])
    mapping.put(16, 99)
    assert list(mapping.items()) == [(16, 99), (0, 0), (1, 1)]
    mapping.remove(16)
    mapping.remove(42)
    assert list(mapping.items()) == [(0, 0), (1, 1)]
    assert len(mapping) == 2 and 0 in mapping and 16 not in mapping


def test_hashmap_long_bucket_in_small_table_resizes_instead_of_treeifying() -> None:
    colliding = [i * 64 for i in range(11)]  # all in bucket 0 of tables up to 64
    nine = _int_map(colliding[:9])
    assert nine.capacity() == 32  # a 9th entry in one bin doubles a table below 64 slots
    assert list(nine) == colliding[:9]
    assert _int_map(colliding[:10]).capacity() == 64
    with pytest.raises(NotImplementedError):
        _int_map(colliding)  # a tree bin in a 64-slot table is beyond the model


STORAGES = ["localhost:57280", "localhost:57290", "localhost:57300"]
VECTOR_STORAGE_ORDER = ["localhost:57300", "localhost:57280", "localhost:57290"]


@pytest.mark.parametrize("insertion", [STORAGES, list(reversed(STORAGES)), VECTOR_STORAGE_ORDER])
def test_storage_maps_iterate_like_the_vectors(insertion: list[str]) -> None:
    """Group/assignment/connection payloads list the storages as in vector moment b."""
    mapping = storage_map((s, 0) for s in insertion)
    assert list(JavaHashMap.copy_of(mapping)) == VECTOR_STORAGE_ORDER


def test_replica_id_maps_iterate_like_the_vectors() -> None:
    """Partition metadata orders replicas by ReplicaId hash (partitionId × storage hash):
    partitions 0-2 list 57300, 57280, 57290 and partition 3 lists 57280, 57290, 57300."""
    expected = {p: VECTOR_STORAGE_ORDER for p in (0, 1, 2)} | {3: STORAGES}
    for partition_id, order in expected.items():
        ids = [ReplicaId(partition_id, storage) for storage in VECTOR_STORAGE_ORDER]
        mapping = JavaHashMap.copy_of(JavaHashMap.from_items(ReplicaId.java_hash, ((i, i) for i in ids)))
        assert [replica.storage for replica in mapping] == order
