"""A partition with a `file://` tier, in this process: what the node's tier round uploads and
evicts, reads across the evicted and local segments, and retention over both (the evicted
range is forgotten below the bound, also when it removes the local segments in between; the
tier's copies go once the partition no longer serves them, manifest first, resumed after a
kill), and the scrub over the tier's copies (a flipped bit found in an evicted copy by its
reads, in a local segment's copy by its digest, which is then uploaded again)."""

from __future__ import annotations

import asyncio
import json
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from storage_node_support import flip_data_bits, make_records

from waltz_engine.common.crc import to_signed32
from waltz_engine.common.errors import StorageError
from waltz_engine.common.object_store import ObjectStore, ObjectStoreError
from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.ops.inspect import verify
from waltz_engine.storage.node.scrubber import Scrubber
from waltz_engine.storage.partition import Partition
from waltz_engine.storage.segment import CorruptRecordError
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.storage.tier.manifest import TierSegment
from waltz_engine.storage.tier.offload import TierOffloader
from waltz_engine.storage.tier.reads import disk_usage
from waltz_engine.storage.tier.settings import TierSettings
from waltz_engine.zk.retention import BelowRetainedStartError

RECORDS = 40
DATA_BYTES = 32
PER_SEGMENT = 10
THRESHOLD_BYTES = HEADER_SIZE_BYTES + (PER_SEGMENT - 1) * (RECORD_OVERHEAD_BYTES + DATA_BYTES)
KEY = uuid.UUID(int=25)


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[Partition]:
    (tmp_path / "data").mkdir()
    with StorageManager(tmp_path / "data", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        manager.set_partition_assignment([0], True)
        yield manager.partition(0)


def _offload(partition: Partition, tier: Path, local_low_water_mark: int) -> TierOffloader:
    # A session starts with the node at ``local_low_water_mark``; the rest is appended in it.
    records = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    partition.append(records[: local_low_water_mark + 1])
    partition.set_low_water_mark(1, local_low_water_mark)
    partition.append(records[local_low_water_mark + 1 :])
    settings = TierSettings(tier.as_uri(), local_bytes=1, cache_bytes=1)
    return _round(partition, settings, tier.parent, None)


def _round(partition: Partition, settings: TierSettings, directory: Path, bound: int | None) -> TierOffloader:
    """A started node's tier round, the partition's effective retention bound ``bound``."""
    offloader = TierOffloader(settings, KEY, "r", directory, lambda: _workers(partition, bound))  # type: ignore[arg-type, return-value]
    offloader.open_store()
    asyncio.run(offloader.run_once())
    return offloader


def _workers(partition: Partition, bound: int | None = None) -> dict[int, SimpleNamespace]:
    return {0: SimpleNamespace(partition=partition, retention_bound=bound)}


def test_only_segments_at_or_below_the_local_low_water_mark_go(partition: Partition, tmp_path: Path) -> None:
    _offload(partition, tmp_path / "tier", 25)
    manifest = json.loads((tmp_path / "tier" / str(KEY) / "0" / "r" / "manifest.json").read_text())
    assert [(s["first_txid"], s["max_txid"]) for s in manifest["segments"]] == [(0, 9), (10, 19)]
    assert partition.segments == [(20, 29), (30, 39)]  # the last two always stay
    usage = disk_usage(partition)
    assert (usage["local_segments"], usage["tier_segments"], usage["evicted_segments"]) == (2, 2, 2)
    assert partition.records(0, RECORDS) == make_records(0, RECORDS, size_bytes=DATA_BYTES)


def test_before_the_tier_answers_the_evicted_range_is_not_called_removed(
    partition: Partition, tmp_path: Path
) -> None:
    offloader = _offload(partition, tmp_path / "tier", RECORDS - 1)
    assert partition.tier is not None
    partition.tier.close()
    partition.tier = None  # as a node starting with the store unreachable
    restarted = TierOffloader(offloader.settings, KEY, "r", tmp_path, lambda: {})
    with pytest.raises(StorageError, match="not reached yet"):
        restarted.attach(partition)
    with pytest.raises(StorageError, match="has not answered yet") as raised:
        partition.records(0, 1)
    assert not isinstance(raised.value, BelowRetainedStartError)  # a server reads another replica
    restarted.open_store()
    restarted.attach(partition)
    assert partition.first_transaction_id() == 0
    assert partition.records(0, RECORDS) == make_records(0, RECORDS, size_bytes=DATA_BYTES)
    report = verify(partition.directory.parent)  # the local files stay a storage directory
    assert report.ok, report.problems


def test_retention_forgets_the_evicted_range_below_its_bound(partition: Partition, tmp_path: Path) -> None:
    _offload(partition, tmp_path / "tier", RECORDS - 1)
    assert partition.segments == [(20, 29), (30, 39)]
    assert partition.remove_head_segments(15) == [(0, 9)]
    assert partition.first_transaction_id() == 10
    with pytest.raises(BelowRetainedStartError):
        partition.records(5, 1)
    assert partition.records(10, 1) == make_records(10, 1, size_bytes=DATA_BYTES)
    assert partition.remove_head_segments(35) == [(10, 19), (20, 29)]
    assert partition.first_transaction_id() == 30
    assert partition.records(30, RECORDS) == make_records(30, 10, size_bytes=DATA_BYTES)


def _objects(tier: Path) -> list[str]:
    return sorted(p.name for p in (tier / str(KEY) / "0" / "r").iterdir())


def _manifest_spans(tier: Path) -> list[tuple[int, int]]:
    manifest = json.loads((tier / str(KEY) / "0" / "r" / "manifest.json").read_text())
    return [(s["first_txid"], s["max_txid"]) for s in manifest["segments"]]


def test_retention_removes_the_tier_copies_manifest_first_and_resumes_after_a_kill(
    partition: Partition, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]
    # A bound the partition's cleaner has not applied yet: it still serves 0..9, which stays.
    _round(partition, settings, tmp_path, 15)
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]

    partition.remove_head_segments(15)
    # Killed after the new manifest, before the deletes: the manifest names no missing object.
    with monkeypatch.context() as patched:
        patched.setattr(ObjectStore, "delete", _killed)
        _round(partition, settings, tmp_path, 15)
    assert _manifest_spans(tier) == [(10, 19), (20, 29)]
    assert f"{0:019d}.seg" in _objects(tier)
    # The restarted node's first round deletes what the manifest no longer names.
    _round(partition, settings, tmp_path, 15)
    names = [f"{first:019d}{suffix}" for first in (10, 20) for suffix in (".idx", ".seg")]
    assert _objects(tier) == sorted([*names, "manifest.json"])
    assert partition.records(10, 30) == make_records(10, 30, size_bytes=DATA_BYTES)

    partition.remove_head_segments(35)  # the local (20, 29) and the evicted (10, 19)
    _round(partition, settings, tmp_path, 35)
    assert _manifest_spans(tier) == []
    assert _objects(tier) == ["manifest.json"]
    assert disk_usage(partition)["tier_segments"] == 0
    assert partition.records(30, 10) == make_records(30, 10, size_bytes=DATA_BYTES)


def _killed(store: ObjectStore, name: str) -> None:
    raise ObjectStoreError(f"{store.url}: cannot delete {name}: killed")


def test_the_scrub_finds_a_flipped_bit_in_the_tier_copies(partition: Partition, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    offloader = _offload(partition, tier, RECORDS - 1)
    prefix = tier / str(KEY) / "0" / "r"
    assert partition.segments == [(20, 29), (30, 39)]  # 0..19 evicted, 20..29 also in the tier
    flip_data_bits(prefix, [3])
    local_copy = prefix / f"{20:019d}.seg"
    whole = local_copy.read_bytes()
    local_copy.write_bytes(whole[:-1] + bytes([whole[-1] ^ 0x01]))

    scrubber = Scrubber(lambda: _workers(partition), tier=offloader)  # type: ignore[arg-type, return-value]
    asyncio.run(scrubber.scrub_partition(partition))
    (damage,) = partition.damage_report()
    assert (damage.segment, damage.transactions) == (0, ((3, 3),)), damage
    assert _manifest_spans(tier) == [(0, 9), (10, 19)]  # the rotten copy of a local segment left
    assert local_copy.read_bytes() != whole  # the scrub only reads

    _round(partition, offloader.settings, tmp_path, None)
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]
    assert local_copy.read_bytes() == whole  # uploaded again from the local files


def test_a_tier_that_fails_reads_does_not_end_the_scrubber(
    partition: Partition, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulator's seed 1948: a store answering 500 to the read of an evicted segment ended the
    # scrubber's task, and the node's stop then raised the store's error.
    offloader = _offload(partition, tmp_path / "tier", RECORDS - 1)
    assert partition.segments[0][0] == 20  # 0..19 in the tier only
    store = partition.tier._store  # type: ignore[union-attr]

    def failing(name: str, size: int, sink: Any) -> Any:
        raise ObjectStoreError(f"{store.url}: cannot read {name}: the store answered an error (500)")

    monkeypatch.setattr(store, "download_to", failing)
    scrubber = Scrubber(lambda: _workers(partition), start_delay_s=0, tier=offloader)  # type: ignore[arg-type, return-value]

    async def two_passes() -> None:
        scrubber.start()
        async with asyncio.timeout(30):
            while scrubber.passes < 1:
                await asyncio.sleep(0.01)
        await scrubber.stop()  # raised the store's error, the task having died of it

    asyncio.run(two_passes())
    assert scrubber.passes >= 1


def test_a_segment_above_the_local_low_water_mark_is_not_evicted_on_an_older_manifest(
    partition: Partition, tmp_path: Path
) -> None:
    """The simulator's seed 1429: a replica's tier prefix keeps the manifest of its earlier
    holding of the partition (uploaded at or below the mark then); moved back and filled again,
    its local low-water mark -1, segments of the same spans were evicted on that manifest and
    retention then forgot them: removed above the mark, not known committed."""
    _offload(partition, tmp_path / "tier", RECORDS - 1)  # the earlier holding: (0, 9)..(20, 29) in the tier
    (tmp_path / "again").mkdir()
    with StorageManager(tmp_path / "again", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        manager.set_partition_assignment([0], True)
        again = manager.partition(0)
        again.append(make_records(0, RECORDS, size_bytes=DATA_BYTES))  # no session yet: the mark is -1
        assert again.info.current.local_low_water_mark == -1
        settings = TierSettings((tmp_path / "tier").as_uri(), local_bytes=1, cache_bytes=1)
        _round(again, settings, tmp_path / "again-tier", 35)
        assert again.segments == [(0, 9), (10, 19), (20, 29), (30, 39)]  # nothing evicted
        assert again.remove_head_segments(35) == []  # nor removed
        assert again.first_transaction_id() == 0


def test_the_evicted_head_of_a_replica_assigned_again_is_not_forgotten_above_its_mark(tmp_path: Path) -> None:
    """The simulator's seed 2932 (and bank seed 224): a replica evicted its head at or below its
    mark, was unassigned (the mark reset to -1, the files and the manifest kept) and assigned
    again as a move's target; retention forgot the evicted head below the bound, above the mark
    -1: removed what the replica did not know committed. It waits until a session sets a mark."""
    (tmp_path / "data").mkdir()
    with StorageManager(tmp_path / "data", KEY, 1, segment_size_threshold_bytes=THRESHOLD_BYTES) as manager:
        manager.set_partition_assignment([0], True)
        offloader = _offload(manager.partition(0), tmp_path / "tier", 25)  # evicted: (0, 9), (10, 19)
        manager.set_partition_assignment([0], False)  # reset: the mark is -1, the files stay
        manager.set_partition_assignment([0], True)
        again = manager.partition(0)
        offloader.attach(again)
        assert again.info.current.local_low_water_mark == -1
        assert again.first_transaction_id() == 0  # the evicted head is served again
        assert again.remove_head_segments(15) == []
        assert again.first_transaction_id() == 0
        assert again.records(0, 1) == make_records(0, 1, size_bytes=DATA_BYTES)
        again.set_low_water_mark(2, RECORDS - 1)  # a session: every record held is committed
        assert again.remove_head_segments(15) == [(0, 9)]
        assert again.first_transaction_id() == 10


def _other_records(first: int, count: int) -> list[Record]:
    """Records of the same txids and sizes as ``make_records``'s, with other bytes (a later
    session's appends after a truncate)."""
    records = []
    for record in make_records(first, count, size_bytes=DATA_BYTES):
        data = (f"new-{record.transaction_id}-".encode() * DATA_BYTES)[:DATA_BYTES]
        records.append(record._replace(data=data, checksum=to_signed32(zlib.crc32(data))))
    return records


def test_a_truncate_into_the_evicted_range_begins_the_log_again_and_voids_the_cut_copies(
    partition: Partition, tmp_path: Path
) -> None:
    """The simulator's seeds 399 and 30447: a replica's last store session set its low-water mark
    (the tier evicted up to it) and ended before ZooKeeper recorded that, so each later session
    cut it to its older closing mark, inside the evicted range: refused ("transaction id out of
    range"), every recovery failed on it, for good. The cut segment goes whole (its copy in the
    tier cannot be cut) and the log begins again there, to be filled from another replica; the
    tier copies holding cut records leave the manifest before a segment grown again to the same
    span could be evicted for them."""
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert partition.segments == [(20, 29), (30, 39)]  # 0..19 in the tier only
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]

    assert partition.truncate(14) == 9  # 10..14 go with their segment: fewer than asked
    assert partition.segments == [(10, 9)]
    assert partition.first_transaction_id() == 0
    assert partition.records(0, RECORDS) == make_records(0, 10, size_bytes=DATA_BYTES)

    # Filled again, then a later session's records with other bytes; a session sets its mark.
    partition.append(make_records(10, 5, size_bytes=DATA_BYTES))
    partition.append(_other_records(15, RECORDS - 15))
    partition.set_low_water_mark(2, RECORDS - 1)
    _round(partition, settings, tmp_path, None)
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]  # (10, 19), (20, 29) uploaded anew
    assert partition.segments == [(20, 29), (30, 39)]
    expected = make_records(0, 15, size_bytes=DATA_BYTES) + _other_records(15, RECORDS - 15)
    assert partition.records(0, RECORDS) == expected  # never the cut copies' bytes


def test_a_copy_the_local_segment_no_longer_matches_is_not_evicted_for_after_a_restart(
    partition: Partition, tmp_path: Path
) -> None:
    """A node killed after a truncate cut a local segment whose copy is in the tier, before its
    next round took that copy out of the manifest: grown again to the same span with other bytes,
    the segment was evicted for the old copy, whose bytes were then served. A copy this process
    did not upload is compared with the local files before anything is evicted for it."""
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert partition.segments == [(20, 29), (30, 39)]
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]  # 20..29 also local
    assert partition.truncate(24) == 24
    assert partition.tier is not None
    partition.tier.close()
    partition.tier = None  # the node restarts: what the truncate noted for the tier is gone

    more = 10  # a third segment, so that 20..29 is not one of the last two, which always stay
    partition.append(_other_records(25, RECORDS + more - 25))
    partition.set_low_water_mark(2, RECORDS + more - 1)
    _round(partition, settings, tmp_path, None)
    expected = make_records(0, 25, size_bytes=DATA_BYTES) + _other_records(25, RECORDS + more - 25)
    assert partition.records(0, RECORDS + more) == expected
    _round(partition, settings, tmp_path, None)  # uploaded anew, then evicted
    assert partition.segments == [(30, 39), (40, 49)]
    assert partition.records(0, RECORDS + more) == expected


def _restart(partition: Partition) -> None:
    """The node restarts: what its process noted for the tier (cuts, copies checked) is gone."""
    assert partition.tier is not None
    partition.tier.close()
    partition.tier = None


def _manifest_entry(tier: Path, first: int) -> TierSegment:
    manifest = json.loads((tier / str(KEY) / "0" / "r" / "manifest.json").read_text())
    (entry,) = [s for s in manifest["segments"] if s["first_txid"] == first]
    return TierSegment.from_json(entry)


def test_a_cut_after_the_round_began_is_never_evicted_for_and_voids_only_the_copies_above_it(
    partition: Partition, tmp_path: Path
) -> None:
    """A truncate between a round's look at the cuts and its eviction: the segment, grown again to
    the same span with other records and below the mark, is not evicted for its old copy, which
    holds cut records. The next round takes out of the manifest exactly the copies holding records
    above the truncate point (the evicted ones below it stay and are served), uploads the
    segment anew and evicts it for the new copy."""
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert partition.truncate(24) == 24
    newer = make_records(0, 25, size_bytes=DATA_BYTES) + _other_records(25, RECORDS + 10 - 25)
    partition.append(newer[25:])
    partition.set_low_water_mark(2, RECORDS + 9)
    assert partition.segments == [(20, 29), (30, 39), (40, 49)]
    old_copy = _manifest_entry(tier, 20)
    assert old_copy.span == (20, 29)
    assert partition.evict_to_tier(1, lambda first, last: old_copy if first == 20 else None) == 0
    assert partition.records(0, RECORDS + 10) == newer

    _round(partition, settings, tmp_path, None)
    assert _manifest_spans(tier)[:2] == [(0, 9), (10, 19)]  # below the cut: kept
    assert _manifest_entry(tier, 20) != old_copy  # uploaded anew
    assert partition.segments == [(30, 39), (40, 49)]
    assert partition.records(0, RECORDS + 10) == newer


def test_a_damaged_local_segment_keeps_its_good_tier_copy_and_is_evicted_for_it(
    partition: Partition, tmp_path: Path
) -> None:
    """Rot in a local segment whose copy a process before a restart uploaded: the copy differs
    from the local files, yet it is the good one. It stays in the manifest and the segment is
    evicted for it, so the rotten record is served from the copy. The check of copies against
    the local files dropped it (and the damaged segment cannot be uploaded again): the record
    was refused for good, and the good copy lost."""
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29)]  # 20..29 also local
    _restart(partition)
    flip_data_bits(partition.directory, [23], first=20)
    with pytest.raises(CorruptRecordError):
        partition.records(23, 1)
    expected = make_records(0, RECORDS + 10, size_bytes=DATA_BYTES)
    partition.append(expected[RECORDS:])  # a third segment: 20..29 is no longer one of the last two
    partition.set_low_water_mark(2, RECORDS + 9)

    _round(partition, settings, tmp_path, None)
    assert _manifest_spans(tier) == [(0, 9), (10, 19), (20, 29), (30, 39)]
    assert partition.segments == [(30, 39), (40, 49)]
    assert partition.records(0, RECORDS + 10) == expected
    assert partition.damage_report() == []


def test_a_damaged_local_segment_loses_a_copy_of_other_records(partition: Partition, tmp_path: Path) -> None:
    """The copy of a damaged local segment is kept only when it holds every record the segment
    holds whole: a node killed between a truncate and its next round kept the copy of the cut
    segment, and one grown again with other records, then damaged below the cut, must not be
    evicted for that copy (its records 25..29 are not the log's)."""
    tier = tmp_path / "tier"
    settings = _offload(partition, tier, RECORDS - 1).settings
    assert partition.truncate(24) == 24
    _restart(partition)
    newer = make_records(0, 25, size_bytes=DATA_BYTES) + _other_records(25, RECORDS + 10 - 25)
    partition.append(newer[25:])
    partition.set_low_water_mark(2, RECORDS + 9)
    flip_data_bits(partition.directory, [22], first=20)

    _round(partition, settings, tmp_path, None)
    assert 20 not in [first for first, _ in _manifest_spans(tier)]
    assert partition.segments == [(20, 29), (30, 39), (40, 49)]  # not uploaded (damaged), kept
    assert partition.records(23, RECORDS + 10 - 23) == newer[23:]
    with pytest.raises(CorruptRecordError):
        partition.records(22, 1)


def test_the_damage_of_an_evicted_segment_goes_with_a_cut_into_it(
    partition: Partition, tmp_path: Path
) -> None:
    """A rotten record read from an evicted segment's tier copy is remembered and reported until
    the segment is cut: a truncate into that segment drops it whole, and the segment filled again
    at the same txids from another replica is not reported damaged."""
    tier = tmp_path / "tier"
    _offload(partition, tier, RECORDS - 1)
    flip_data_bits(tier / str(KEY) / "0" / "r", [12], first=10)
    flip_data_bits(tier / str(KEY) / "0" / "r", [3])
    with pytest.raises(CorruptRecordError):
        partition.records(12, 1)
    assert [d.segment for d in partition.damage_report()] == [10]

    assert partition.truncate(14) == 9
    assert partition.damage_report() == []
    partition.append(make_records(10, RECORDS - 10, size_bytes=DATA_BYTES))
    assert partition.damage_report() == []
    assert partition.records(4, RECORDS) == make_records(4, RECORDS - 4, size_bytes=DATA_BYTES)

    with pytest.raises(CorruptRecordError):
        partition.records(3, 1)
    assert [d.segment for d in partition.damage_report()] == [0]
    assert partition.truncate(-1) == -1  # emptied, to be filled again from 0
    assert partition.damage_report() == []
