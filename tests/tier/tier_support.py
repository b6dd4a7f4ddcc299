"""One real storage node with a tier (issue 25): its config, records written and committed,
and reads, for the tier's node tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from storage_node_support import StorageNodeProcess, create_test_cluster, make_records

from waltz_engine.common.record import Record
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES
from waltz_engine.storage.client import StorageRpcError

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


async def write(node: StorageNodeProcess) -> None:
    client = node.data_client()
    await client.open()
    try:
        await client.set_low_water_mark(SESSION_ID, 0, -1)
        await client.append(SESSION_ID, 0, make_records(0, RECORDS, size_bytes=DATA_BYTES))
        # The next session's start: every record is committed, below the local low-water mark.
        await client.set_low_water_mark(NEXT_SESSION_ID, 0, RECORDS - 1)
    finally:
        await client.close()


async def read(
    node: StorageNodeProcess, first: int, count: int, session_id: int = NEXT_SESSION_ID
) -> list[Record]:
    client = node.data_client()
    await client.open()
    try:
        return await client.records(session_id, 0, first, count)
    finally:
        await client.close()


async def refusal_of(node: StorageNodeProcess, transaction_id: int) -> str:
    client = node.data_client()
    await client.open()
    try:
        await client.record(NEXT_SESSION_ID, 0, transaction_id)
    except StorageRpcError as e:
        return str(e)
    finally:
        await client.close()
    raise AssertionError(f"the node served transaction {transaction_id} from a damaged tier object")


def local_segments(node: StorageNodeProcess) -> list[str]:
    return sorted(p.name for p in (node.directory / "0").glob("*.seg"))


def tier_node(zookeeper: str, work_dir: Path, url: str) -> StorageNodeProcess:
    root, key = create_test_cluster(zookeeper, 1)
    config: dict[str, Any] = {
        "storage.segment.size.threshold": THRESHOLD_BYTES,
        "storage.tier.url": url,
        "storage.tier.local.bytes": 1,  # evict all it may: the last two segments stay
        "storage.tier.cache.bytes": 1,  # only the segment being read stays cached
        "storage.tier.check.interval.ms": 50,
    }
    return StorageNodeProcess(zookeeper, root, key, 1, work_dir, extra_config=config)


def write_and_evict(node: StorageNodeProcess) -> None:
    node.start()
    node.assign()
    node.run(write(node))
    wait_evicted(node)


def wait_evicted(node: StorageNodeProcess) -> None:
    """Until the node keeps only its last two segments (bounded)."""
    kept = [f"{first:019d}.seg" for first in (20, 30)]
    for _ in range(POLLS):
        if local_segments(node) == kept:
            break
        time.sleep(POLL_S)
    assert local_segments(node) == kept, node.log_text()
