"""Issue 13 item 7: a full disk under a storage node (a real tmpfs filled to the brim).

Each failed batch used to log a whole traceback. Now: a FAILURE to the sender, one warning line
now and then (not per batch), `/health` unhealthy naming the error, reads still served, and
once space is freed the next append succeeds and `/health` is healthy again. Nothing that was
acknowledged is lost or changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_node_support import StorageNodeProcess, create_test_cluster, make_records, node_health

from waltz_engine.storage.client import StorageRpcError

TMPFS_SIZE = "4m"
# What the filler leaves free: the first segment's files and a few batches.
HEADROOM_BYTES = 96 * 1024
RECORD_BYTES = 1024
BATCH_RECORDS = 8
SESSION_ID = 1
FAILED_BATCHES = 40


@contextlib.contextmanager
def _tmpfs(mount_point: Path) -> Iterator[Path]:
    mount_point.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(directory: Path) -> Path:
    """A file taking all but HEADROOM_BYTES of the file system."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    filler = directory / "filler"
    filler.write_bytes(b"\0" * max(0, free - HEADROOM_BYTES))
    return filler


def test_full_disk_fails_writes_with_one_line_and_a_health_state(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, 1)
    with _tmpfs(tmp_path / "node" / "data") as data:
        node = StorageNodeProcess(zookeeper, root, key, 1, tmp_path / "node")
        node.start()
        try:
            node.assign()
            assert node.jetty_port is not None
            filler = _fill(data)

            async def until_full() -> int:
                client = node.data_client()
                await client.open()
                try:
                    await client.last_session_info(SESSION_ID, 0)
                    txid, failures = 0, 0
                    while failures < FAILED_BATCHES:
                        records = make_records(txid, BATCH_RECORDS, 0, RECORD_BYTES)
                        try:
                            await client.append(SESSION_ID, 0, records)
                            txid += BATCH_RECORDS
                        except StorageRpcError as e:
                            assert "No space left on device" in str(e), e
                            failures += 1
                    # Reads are still served, and hold exactly what was acknowledged.
                    assert await client.records(SESSION_ID, 0, 0, txid + 1) == make_records(
                        0, txid, 0, RECORD_BYTES
                    )
                    return txid
                finally:
                    await client.close()

            acknowledged = node.run(until_full())
            assert acknowledged > 0
            status, body = node_health(node.jetty_port)
            assert status != 200, body
            disk = json.loads(str(body["storage-disk-check"]["message"]))  # type: ignore[index]
            assert "No space left on device (ENOSPC)" in disk["write_errors"]["0"]
            log = node.log_text()
            assert "Traceback" not in log
            assert log.count("No space left on device") <= 2, log  # not one per failed batch

            filler.unlink()

            async def after_freeing() -> None:
                client = node.data_client()
                await client.open()
                try:
                    more = make_records(acknowledged, BATCH_RECORDS, 0, RECORD_BYTES)
                    await client.append(SESSION_ID, 0, more)
                    stored = await client.records(SESSION_ID, 0, 0, acknowledged + BATCH_RECORDS + 1)
                    assert stored == make_records(0, acknowledged + BATCH_RECORDS, 0, RECORD_BYTES)
                finally:
                    await client.close()

            node.run(after_freeing())
            status, body = node_health(node.jetty_port)
            assert status == 200, body
        finally:
            node.close()
