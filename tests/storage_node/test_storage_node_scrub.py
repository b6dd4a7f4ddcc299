"""The background scrub finds rot that start-up cannot see (issue 13, item 2).

Start-up checks only the last records of each segment. A flipped bit early in a big sealed
segment used to stay unknown until something read that record. The scrub reads every record
at a bounded rate: the damage is reported in `/health` without any reader, and no byte changes.
"""

from __future__ import annotations

import time
from pathlib import Path

from storage_node_support import (
    ISSUED_SESSION_ID,
    StorageNodeProcess,
    create_test_cluster,
    directory_digest,
    flip_data_bits,
    make_records,
    node_health,
)

from waltz_engine.disk.record_format import RECORD_OVERHEAD_BYTES

DATA_BYTES = 16
FIRST_SEGMENT_RECORDS = 2_500  # start-up checks only its last 1 000
RECORDS = FIRST_SEGMENT_RECORDS + 100
ROTTEN = 100
SCRUB_BYTES_PER_SECOND = 64 * 1024 * 1024
REPORT_TIMEOUT_S = 60.0


def test_scrub_reports_rot_below_the_start_up_window(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, 1)
    threshold = FIRST_SEGMENT_RECORDS * (RECORD_OVERHEAD_BYTES + DATA_BYTES) - 1
    node = StorageNodeProcess(
        zookeeper,
        root,
        key,
        1,
        tmp_path,
        extra_config={
            "storage.segment.size.threshold": threshold,
            "storage.scrub.bytes.per.second": SCRUB_BYTES_PER_SECOND,
        },
    )
    node.start()
    try:
        node.assign()

        async def write() -> None:
            client = node.data_client()
            await client.open()
            try:
                records = make_records(0, RECORDS, 0, DATA_BYTES)
                await client.append(ISSUED_SESSION_ID, 0, records)
                await client.set_low_water_mark(ISSUED_SESSION_ID, 0, RECORDS - 1)
            finally:
                await client.close()

        node.run(write())
        node.close()
        partition_dir = node.directory / "0"
        assert len(list(partition_dir.glob("*.seg"))) == 2
        flip_data_bits(partition_dir, [ROTTEN])
        flipped = directory_digest(partition_dir)

        node.start()
        assert node.jetty_port is not None
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while True:
            status, body = node_health(node.jetty_port)
            if status != 200:
                break
            assert time.monotonic() < deadline, f"the scrub did not report the rot: {body}"
            time.sleep(0.2)
        check = body["storage-integrity-check"]
        assert not check["healthy"] and f"transactions {ROTTEN}" in check["message"], check
        assert "Traceback" not in node.log_text()
        assert directory_digest(partition_dir) == flipped  # the scrub only reads
    finally:
        node.close()
