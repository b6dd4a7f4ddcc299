"""Issue 32 with one real storage node and a `file://` tier: a truncate into the range the node
evicted to the tier, asked through the wire as a recovery asks it (TRUNCATE, answered with
MAX_TRANSACTION_ID), and rot in a local segment whose copy a process before a restart uploaded
(the copy repairs it), and a node killed in the middle of such a truncate."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from storage_node_support import StorageNodeProcess, flip_data_bits, make_records
from tier_support import (
    DATA_BYTES,
    NEXT_SESSION_ID,
    POLL_S,
    POLLS,
    RECORDS,
    local_segments,
    read,
    tier_node,
    write_and_evict,
)

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.tier.offload import replica_name
from waltz_engine.storage.tier.reads import KILL_AT_ENV

# A later store session than the one that set the node's marks (``tier_support.write``).
LATER_SESSION_ID = NEXT_SESSION_ID + 1
# Inside the evicted segment 10..19: ZooKeeper's older closing mark for this replica, say.
CUT = 14


def _manifest(node: StorageNodeProcess, tier: Path) -> dict[int, object]:
    prefix = tier / str(node.key) / "0" / replica_name(node.host, node.port)
    manifest = json.loads((prefix / "manifest.json").read_text())
    return {s["first_txid"]: s for s in manifest["segments"]}


def _wait_local(node: StorageNodeProcess, firsts: list[int]) -> None:
    """Until the node's local segments begin at ``firsts`` (bounded)."""
    kept = [f"{first:019d}.seg" for first in firsts]
    for _ in range(POLLS):
        if local_segments(node) == kept:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"local segments {local_segments(node)}, not {kept}:\n{node.log_text()}")


async def _read(node: StorageNodeProcess, first: int, count: int) -> list[Record]:
    return await read(node, first, count, LATER_SESSION_ID)


def test_a_truncate_through_the_wire_into_the_evicted_range_begins_the_log_again(
    zookeeper: str, tmp_path: Path
) -> None:
    """A recovery that cuts this replica to a mark older than its disk's (ZooKeeper's closing
    mark, which a Java 0.13.2 server takes as it is) lands inside the evicted range. Refused,
    every recovery failed on it, for good. The node drops the evicted segment holding the cut
    and answers the max txid it kept, 9 (below the 14 asked, as a replica holding fewer
    records), takes the records the recovery copies from another replica and its low-water mark
    once caught up, serves the whole log again, before and after a restart, and the tier holds
    new copies of the cut segments. The original's order (the mark set before the catch-up) is
    refused here as a Java node refuses it: the local low-water mark would go down."""
    tier = tmp_path / "tier"
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        write_and_evict(node)  # 0..19 only in the tier; marks at 39
        before = _manifest(node, tier)
        assert sorted(before) == [0, 10, 20]

        async def recover() -> tuple[int, str]:
            client = node.data_client()
            await client.open()
            try:
                kept = await client.truncate(LATER_SESSION_ID, 0, CUT)
                try:
                    await client.set_low_water_mark(LATER_SESSION_ID, 0, RECORDS - 1)
                    refusal = ""
                except StorageRpcError as e:
                    refusal = str(e)
                await client.append(LATER_SESSION_ID, 0, expected[kept + 1 :])  # from another replica
                await client.set_low_water_mark(LATER_SESSION_ID, 0, RECORDS - 1)
                return kept, refusal
            finally:
                await client.close()

        kept, refusal = node.run(recover())
        assert kept == 9
        assert "unable to set local low watermark to value 9" in refusal, refusal
        assert "the log begins again at 10" in node.log_text()
        assert node.run(_read(node, 0, RECORDS)) == expected

        _wait_local(node, [20, 30])  # 10..29 uploaded anew and evicted
        after = _manifest(node, tier)
        assert sorted(after) == [0, 10, 20]
        assert after[0] == before[0]  # below the cut: the same copy
        assert after[10] != before[10]
        node.kill()
        node.start()
        assert node.run(_read(node, 0, RECORDS)) == expected


def test_a_damaged_local_segment_is_repaired_by_its_tier_copy_after_a_restart(
    zookeeper: str, tmp_path: Path
) -> None:
    """Rot in local segment 20..29, whose copy the node uploaded before it was killed: the
    restarted node keeps the copy (its records are the ones the local segment holds whole) and
    evicts the segment for it, so the rotten record is served again, from the copy."""
    tier = tmp_path / "tier"
    expected = make_records(0, RECORDS + 10, size_bytes=DATA_BYTES)
    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        write_and_evict(node)
        node.kill()
        flip_data_bits(node.directory / "0", [23], first=20)
        node.start()

        async def grow() -> None:
            client = node.data_client()
            await client.open()
            try:
                await client.set_low_water_mark(LATER_SESSION_ID, 0, RECORDS - 1)
                await client.append(LATER_SESSION_ID, 0, expected[RECORDS:])
                await client.set_low_water_mark(LATER_SESSION_ID, 0, RECORDS + 9)
            finally:
                await client.close()

        node.run(grow())
        _wait_local(node, [30, 40])
        assert sorted(_manifest(node, tier)) == [0, 10, 20, 30]
        assert node.run(_read(node, 0, RECORDS + 10)) == expected
        assert "its copy in the tier holds every record it holds whole" in node.log_text()


def test_a_node_killed_in_a_truncate_into_the_evicted_range_is_filled_again(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed once the truncate removed the local segments (the directory synced) and before it
    created the new one, with nothing written to the control file (a truncate never writes it,
    as the original's): the restarted node holds no segment, makes segment 0 and serves an empty
    log, whose evicted head it no longer claims; the truncate asked again keeps nothing, the
    recovery fills it from another replica, and the copies the truncate voided (a note lost in
    the kill) are never served: each is checked against the local segment before anything is
    evicted for it."""
    tier = tmp_path / "tier"
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)

    async def truncate(node: StorageNodeProcess) -> int:
        client = node.data_client()
        await client.open()
        try:
            return await client.truncate(LATER_SESSION_ID, 0, CUT)
        finally:
            await client.close()

    with tier_node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        monkeypatch.setenv(KILL_AT_ENV, "cut")
        write_and_evict(node)
        with pytest.raises(WaltzError):
            node.run(truncate(node))
        assert node.wait_exit() == -signal.SIGKILL
        assert local_segments(node) == []

        monkeypatch.delenv(KILL_AT_ENV)
        node.start()
        assert local_segments(node) == [f"{0:019d}.seg"]
        assert node.run(truncate(node)) == -1
        assert node.run(_read(node, 0, RECORDS)) == []

        async def fill() -> None:
            client = node.data_client()
            await client.open()
            try:
                await client.append(LATER_SESSION_ID, 0, expected)
                await client.set_low_water_mark(LATER_SESSION_ID, 0, RECORDS - 1)
            finally:
                await client.close()

        node.run(fill())
        _wait_local(node, [20, 30])
        assert node.run(_read(node, 0, RECORDS)) == expected
        node.kill()
        node.start()
        assert node.run(_read(node, 0, RECORDS)) == expected
