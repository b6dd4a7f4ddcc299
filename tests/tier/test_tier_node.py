"""Issue 25 with one real storage node: sealed, committed segments go to a `file://` tier (and
to S3 through a local moto server), the oldest leave the local disk, reads of them come back
from the tier checked record by record (a bit flipped in a tier object is refused, naming the
record), and a restarted node finds its evicted range again from its manifest. A node killed
during an upload (reached with a slow rate), during an eviction and during a read back (reached
with the tier's kill hook) loses nothing: the manifest names only whole objects, and the reads
complete after the restart."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from moto_support import moto_s3_url
from storage_node_support import (
    StorageNodeProcess,
    create_test_cluster,
    directory_digest,
    flip_data_bits,
    make_records,
)

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.ops.inspect import inspect_control
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.storage.tier.offload import replica_name
from waltz_engine.storage.tier.reads import KILL_AT_ENV

SESSION_ID = 7
NEXT_SESSION_ID = 8
RECORDS = 40
DATA_BYTES = 32
PER_SEGMENT = 10  # the threshold below rolls over after every 10th record
THRESHOLD_BYTES = HEADER_SIZE_BYTES + (PER_SEGMENT - 1) * (RECORD_OVERHEAD_BYTES + DATA_BYTES)
ROTTEN = 3
# Waits for the node's tier rounds (every 50 ms): POLL_S at most POLLS times (30 s).
POLL_S = 0.05
POLLS = 600


async def _write(node: StorageNodeProcess) -> None:
    client = node.data_client()
    await client.open()
    try:
        await client.set_low_water_mark(SESSION_ID, 0, -1)
        await client.append(SESSION_ID, 0, make_records(0, RECORDS, size_bytes=DATA_BYTES))
        # The next session's start: every record is committed, below the local low-water mark.
        await client.set_low_water_mark(NEXT_SESSION_ID, 0, RECORDS - 1)
    finally:
        await client.close()


async def _read(node: StorageNodeProcess, first: int, count: int) -> list[Record]:
    client = node.data_client()
    await client.open()
    try:
        return await client.records(NEXT_SESSION_ID, 0, first, count)
    finally:
        await client.close()


async def _refusal(node: StorageNodeProcess, transaction_id: int) -> str:
    client = node.data_client()
    await client.open()
    try:
        await client.record(NEXT_SESSION_ID, 0, transaction_id)
    except StorageRpcError as e:
        return str(e)
    finally:
        await client.close()
    raise AssertionError(f"the node served transaction {transaction_id} from a damaged tier object")


def _local_segments(node: StorageNodeProcess) -> list[str]:
    return sorted(p.name for p in (node.directory / "0").glob("*.seg"))


def _node(zookeeper: str, work_dir: Path, url: str) -> StorageNodeProcess:
    root, key = create_test_cluster(zookeeper, 1)
    config: dict[str, Any] = {
        "storage.segment.size.threshold": THRESHOLD_BYTES,
        "storage.tier.url": url,
        "storage.tier.local.bytes": 1,  # evict all it may: the last two segments stay
        "storage.tier.cache.bytes": 1,  # only the segment being read stays cached
        "storage.tier.check.interval.ms": 50,
    }
    return StorageNodeProcess(zookeeper, root, key, 1, work_dir, extra_config=config)


def _write_and_evict(node: StorageNodeProcess) -> None:
    node.start()
    node.assign()
    node.run(_write(node))
    _wait_evicted(node)


def _wait_evicted(node: StorageNodeProcess) -> None:
    """Until the node keeps only its last two segments (bounded)."""
    kept = [f"{first:019d}.seg" for first in (20, 30)]
    for _ in range(POLLS):
        if _local_segments(node) == kept:
            break
        time.sleep(POLL_S)
    assert _local_segments(node) == kept, node.log_text()


def test_offload_evict_read_back_refuse_a_flipped_bit_and_restart(zookeeper: str, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    with _node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        _write_and_evict(node)
        key = node.key
        prefix = tier / str(key) / "0" / replica_name(node.host, node.port)
        manifest = json.loads((prefix / "manifest.json").read_text())
        assert [s["first_txid"] for s in manifest["segments"]] == [0, 10, 20]
        (partition,) = inspect_control(node.directory)["partitions"]
        local_files = list((node.directory / "0").iterdir())
        assert (partition["local_segments"], partition["local_bytes"]) == (
            2,
            sum(f.stat().st_size for f in local_files),
        )
        local = directory_digest(node.directory / "0")

        expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
        assert node.run(_read(node, 0, RECORDS)) == expected

        flip_data_bits(prefix, [ROTTEN])
        assert node.run(_read(node, 0, ROTTEN)) == expected[:ROTTEN]
        refusal = node.run(_refusal(node, ROTTEN))
        assert f"corrupt record: partition 0 transaction {ROTTEN}" in refusal, refusal
        assert "differs from what was uploaded" in node.log_text()

        node.kill()
        node.start()
        assert node.run(_read(node, PER_SEGMENT, RECORDS - PER_SEGMENT)) == expected[PER_SEGMENT:]
        assert directory_digest(node.directory / "0") == local  # whole local files, untouched


def test_offload_evict_and_read_back_over_s3(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    with moto_s3_url("tier", "waltz", monkeypatch) as url, _node(zookeeper, tmp_path / "node", url) as node:
        _write_and_evict(node)
        assert node.run(_read(node, 0, RECORDS)) == expected
        node.kill()
        node.start()
        assert node.run(_read(node, 0, RECORDS)) == expected


def test_a_node_killed_during_an_upload_loses_nothing_and_finishes_after_restart(
    zookeeper: str, tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    with _node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        fast = yaml.safe_load(node.config_path.read_text())
        node.config_path.write_text(yaml.safe_dump({**fast, "storage.tier.bytes.per.second": 100}))
        node.start()
        node.assign()
        node.run(_write(node))
        debris = tier / str(node.key) / ".tmp" / replica_name(node.host, node.port)
        for _ in range(POLLS):  # an object written, its upload waiting on the rate limit
            if debris.is_dir() and any(debris.iterdir()):
                break
            time.sleep(POLL_S)
        assert debris.is_dir() and any(debris.iterdir()), node.log_text()
        node.kill()

        prefix = tier / str(node.key) / "0" / replica_name(node.host, node.port)
        manifest = prefix / "manifest.json"
        named = json.loads(manifest.read_text())["segments"] if manifest.exists() else []
        for segment in named:  # never an incomplete object
            for suffix in ("seg", "idx"):
                data = (prefix / f"{segment['first_txid']:019d}.{suffix}").read_bytes()
                assert len(data) == segment[suffix]["size"]
                assert hashlib.sha256(data).hexdigest() == segment[suffix]["sha256"]
        assert len(_local_segments(node)) == RECORDS // PER_SEGMENT  # nothing removed locally

        node.config_path.write_text(yaml.safe_dump(fast))
        node.start()
        _wait_evicted(node)
        assert not any(debris.iterdir())
        assert node.run(_read(node, 0, RECORDS)) == make_records(0, RECORDS, size_bytes=DATA_BYTES)


def test_a_node_killed_during_an_eviction_and_during_a_tier_read_loses_nothing(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = tmp_path / "tier"
    expected = make_records(0, RECORDS, size_bytes=DATA_BYTES)
    with _node(zookeeper, tmp_path / "node", tier.as_uri()) as node:
        monkeypatch.setenv(KILL_AT_ENV, "evict")
        node.start()
        node.assign()
        node.run(_write(node))
        assert node.wait_exit() == -signal.SIGKILL  # once segment 0's files were removed
        assert _local_segments(node) == [f"{first:019d}.seg" for first in (10, 20, 30)]

        monkeypatch.setenv(KILL_AT_ENV, "read")
        node.start()  # finds segment 0 in the tier, evicts segment 10
        _wait_evicted(node)
        with pytest.raises(WaltzError):
            node.run(_read(node, 0, 1))
        assert node.wait_exit() == -signal.SIGKILL  # once segment 0's data object was read back
        cache = node.directory / ".tier-cache" / "0"
        assert sorted(p.name for p in cache.iterdir()) == [f"{0:019d}.seg"]
        local = directory_digest(node.directory / "0")

        monkeypatch.delenv(KILL_AT_ENV)
        node.start()
        assert node.run(_read(node, 0, RECORDS)) == expected
        assert directory_digest(node.directory / "0") == local
