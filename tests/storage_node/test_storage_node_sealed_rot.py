"""Issue 13, item 2, with real processes: a bit flipped in a sealed segment leaves the node up,
the segment's bytes unchanged until the refill, and `waltz inspect verify` clean after it.

Two storage nodes hold the same partition. One is stopped and one bit of a record in the
middle of a sealed segment is flipped. Start-up recovery used to cut that segment after the bad
record and then refuse to start ("segment starts at transaction 20, the previous one ends at
12") on every restart. Now the node starts, changes no byte, says what is damaged (its log,
``/health``, ``waltz storage list``), serves every other record, and `waltz storage
recover-partition` from the healthy node puts the segment back byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from storage_node_support import (
    StorageNodeProcess,
    create_test_cluster,
    make_records,
    run_waltz,
)

from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import RECORD_HEADER_SIZE_BYTES, RECORD_OVERHEAD_BYTES
from waltz_engine.storage.client import StorageRpcError
from waltz_engine.zk import store_metadata
from waltz_engine.zk.connection import ZooKeeperSettings, connect

SESSION_ID = 7
NEXT_SESSION_ID = 8
RECORDS = 40
DATA_BYTES = 32
RECORD_BYTES = RECORD_OVERHEAD_BYTES + DATA_BYTES
PER_SEGMENT = 10  # the threshold below rolls over after every 10th record
THRESHOLD_BYTES = HEADER_SIZE_BYTES + (PER_SEGMENT - 1) * RECORD_BYTES
SEALED = 10  # the segment 10-19, between two others
ROTTEN = 12
HTTP_TIMEOUT_S = 10.0


def _segment_files(node: StorageNodeProcess, first: int) -> tuple[Path, Path]:
    seg = node.directory / "0" / f"{first:019d}.seg"
    return seg, seg.with_suffix(".idx")


def _read(files: tuple[Path, Path]) -> tuple[bytes, bytes]:
    return files[0].read_bytes(), files[1].read_bytes()


def _health(node: StorageNodeProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{node.jetty_port}/health", timeout=HTTP_TIMEOUT_S
        ) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _waltz(*args: str) -> Any:
    done = run_waltz(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout) if "--json" in args else done.stdout


def _storage(node: StorageNodeProcess) -> str:
    return f"{node.host}:{node.port}"


async def _write(node: StorageNodeProcess) -> None:
    client = node.data_client()
    await client.open()
    try:
        # A low-water mark below the records: start-up recovery looks at every one of them.
        await client.set_low_water_mark(SESSION_ID, 0, -1)
        records = make_records(0, RECORDS, size_bytes=DATA_BYTES)
        for first in range(0, RECORDS, 7):
            await client.append(SESSION_ID, 0, records[first : first + 7])
    finally:
        await client.close()


async def _reads(node: StorageNodeProcess) -> tuple[list[int], str]:
    """The txids served one by one except the rotten one, and what the node says of that one."""
    client = node.data_client()
    await client.open()
    try:
        served = []
        for txid in range(RECORDS):
            if txid == ROTTEN:
                continue
            record = await client.record(SESSION_ID, 0, txid)
            assert record is not None and record == make_records(txid, 1, size_bytes=DATA_BYTES)[0]
            served.append(txid)
        try:
            await client.record(SESSION_ID, 0, ROTTEN)
        except StorageRpcError as e:
            return served, str(e)
        raise AssertionError(f"the node served the rotten transaction {ROTTEN}")
    finally:
        await client.close()


async def _next_session(node: StorageNodeProcess) -> None:
    """What a server's next store session does on each replica: its low-water mark goes up to
    the high-water mark, so the records are below it (where `recover-partition` refills)."""
    client = node.data_client()
    await client.open()
    try:
        await client.set_low_water_mark(NEXT_SESSION_ID, 0, RECORDS - 1)
    finally:
        await client.close()


def _damaged(where: tuple[str, ...], node: StorageNodeProcess) -> list[dict[str, Any]]:
    listing = _waltz("storage", "list", "-s", _storage(node), "--json", *where)
    (partition,) = listing["nodes"][0]["partitions"]
    damaged: list[dict[str, Any]] = partition["damaged"]
    return damaged


def test_a_sealed_segment_bit_flip_leaves_the_node_up_and_is_refilled(zookeeper: str, tmp_path: Path) -> None:
    root, key = create_test_cluster(zookeeper, 1)
    config = {"storage.segment.size.threshold": THRESHOLD_BYTES}
    healthy = StorageNodeProcess(zookeeper, root, key, 1, tmp_path / "healthy", extra_config=config)
    rotten = StorageNodeProcess(zookeeper, root, key, 1, tmp_path / "rotten", extra_config=config)
    where = ("-z", zookeeper, "-r", root)
    try:
        for node in (healthy, rotten):
            node.start()
            node.assign()
            node.run(_write(node))
        with connect(ZooKeeperSettings(zookeeper, root)) as client:
            for group, node in enumerate((healthy, rotten)):
                store_metadata.add_storage_node(client, root, _storage(node), group, node.admin_port)
        assert sorted(p.name for p in (rotten.directory / "0").glob("*.seg")) == [
            f"{first:019d}.seg" for first in range(0, RECORDS, PER_SEGMENT)
        ]

        rotten.terminate()
        files = _segment_files(rotten, SEALED)
        clean = _read(files)
        shutil.copyfile(files[0], tmp_path / "clean.seg")
        at = HEADER_SIZE_BYTES + (ROTTEN - SEALED) * RECORD_BYTES + RECORD_HEADER_SIZE_BYTES + 5
        fd = os.open(files[0], os.O_RDWR)
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x08]), at)
            os.fsync(fd)
        finally:
            os.close(fd)
        flipped = _read(files)

        rotten.start()  # the node used to exit here, every time
        assert _read(files) == flipped
        log = rotten.log_text()
        assert f"segment {SEALED}-{SEALED + PER_SEGMENT - 1}: transactions {ROTTEN}" in log, log
        status, body = _health(rotten)
        assert status == 500, body
        check = body["storage-integrity-check"]
        assert not check["healthy"] and f"transactions {ROTTEN}" in check["message"], check
        assert body["storage-health-check"]["healthy"]
        (damage,) = _damaged(where, rotten)
        assert (damage["segment"], damage["max_transaction_id"]) == (SEALED, SEALED + PER_SEGMENT - 1)
        assert damage["transactions"] == [[ROTTEN, ROTTEN]], damage

        served, refusal = rotten.run(_reads(rotten))
        assert served == [t for t in range(RECORDS) if t != ROTTEN]
        assert f"corrupt record: partition 0 transaction {ROTTEN}" in refusal, refusal
        assert _read(files) == flipped  # reading changed nothing either
        assert run_waltz("inspect", "verify", str(rotten.directory)).returncode == 1
        for node in (healthy, rotten):
            node.run(_next_session(node))
        assert _read(files) == flipped

        _waltz("storage", "availability", "-s", _storage(rotten), "-p", "0", "--offline", *where)
        recover = ("-s", _storage(healthy), "--destination-storage", _storage(rotten), "-p", "0", "-b", "3")
        report = _waltz("storage", "recover-partition", *recover, "--json", *where)
        assert report["records_refilled"] == PER_SEGMENT, report
        assert _read(files) == clean  # byte for byte what the node wrote before the flip
        verified = run_waltz("inspect", "verify", str(rotten.directory))
        assert verified.returncode == 0, (verified.stdout, verified.stderr)

        _waltz("storage", "availability", "-s", _storage(rotten), "-p", "0", "--online", *where)
        assert _damaged(where, rotten) == []
        status, body = _health(rotten)
        assert status == 200, body
        assert rotten.running
    finally:
        healthy.close()
        rotten.close()
