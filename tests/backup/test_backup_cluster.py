"""`waltz backup` against a live 3-storage cluster (real processes): create while appends go
on, incremental runs that copy only what is new (sealed segments never rewritten), verify, list,
restore (whole and up to a txid) into directories `inspect verify` finds clean, a storage node
brought back from a backup and caught up, S3 through a local moto server, and runs killed at
every file operation that never leave a half-visible backup."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import append_lines, local_cluster, run_waltz_cli, tailed, waltz_cli_command
from moto_support import moto_s3_url

from waltz_engine.common.config import Config
from waltz_engine.ops.backup import KILL_AT_ENV, create_backup, verify_backup
from waltz_engine.ops.devcluster import LocalCluster
from waltz_engine.ops.inspect import verify as inspect_verify
from waltz_engine.storage.admin_ops.recovery import replica_checksums
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.storage.storage_manager import StorageManager
from waltz_engine.zk.connection import ZooKeeperSettings

PARTITIONS = (0, 1)
EMPTY_PARTITION = 2  # never appended to: a backup holds it, and a restore says it is empty
NUM_PARTITIONS = len(PARTITIONS) + 1
# Small segments: every run seals some, so "sealed segments are written once" is exercised.
SEGMENT_BYTES = "2048"
KILL_POINTS_AT_LEAST = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(
        tmp_path_factory, storages=3, servers=1, partitions=NUM_PARTITIONS, zookeeper=zookeeper
    ) as c:
        append_lines(c, {p: [f"first-{p}-{i}" for i in range(60 + 40 * p)] for p in PARTITIONS})
        yield c


def lines(cluster: LocalCluster, tag: str, count: int) -> None:
    append_lines(cluster, {p: [f"{tag}-{p}-{i}" for i in range(count)] for p in PARTITIONS})


def cli_json(*args: str) -> dict:
    result = run_waltz_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def restored_rows(directory: Path, key: str, partitions: int) -> list[tuple]:
    """Every record of a restored directory as `tailed` rows, read with the storage engine."""
    rows = []
    with StorageManager(directory, uuid.UUID(key), partitions) as manager:
        for p in manager.assigned_partition_ids():
            for r in manager.partition(p).records(0, 10**6):
                rows.append((p, r.transaction_id, *r.req_id[:2], r.req_id.seq_num, r.header, r.data.hex()))
    return rows


def _snapshot(directory: Path) -> dict[str, str]:
    """Every file's SHA-256 and every directory under ``directory``."""
    return {
        str(p.relative_to(directory)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
    }


def test_create_under_appends_then_incremental_verify_list_restore(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    url = str(tmp_path / "backup")
    config = str(cluster.client_config_path)
    # A backup taken while appends go on: it holds what was committed when it read the bound.
    appender = subprocess.Popen(
        waltz_cli_command("append", "--partition", "0", "--config", config),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = cli_json("backup", "create", "-c", config, "--to", url, "--segment-size-bytes", SEGMENT_BYTES)
    _, err = appender.communicate("\n".join(f"live-{i}" for i in range(200)) + "\n", timeout=120)
    assert appender.returncode == 0, err
    assert first["published"] and first["sequence"] == 1
    assert first["records_added"] == sum(v["last_txid"] + 1 for v in first["partitions"].values())
    assert cli_json("backup", "verify", url)["ok"]
    listed = cli_json("backup", "list", url)
    assert {p["partition"]: p["last_txid"] for p in listed["partitions"]} == {
        int(p): v["last_txid"] for p, v in first["partitions"].items()
    }
    sealed_before = {
        f: os.stat(f).st_ino
        for p in PARTITIONS
        for f in sorted((tmp_path / "backup" / str(p)).glob("*.seg"))[:-1]
    }
    assert sealed_before, "the first run sealed some segments"

    lines(cluster, "second", 30)
    rows = tailed(cluster, PARTITIONS)
    second = cli_json("backup", "create", "-c", config, "--to", url, "--segment-size-bytes", SEGMENT_BYTES)
    last = {p: max(t for q, t, *_ in rows if q == p) for p in PARTITIONS}
    assert second["sequence"] == 2
    # Only the new records were copied, and no sealed segment was written again.
    assert second["records_added"] == sum(
        last[p] - first["partitions"][str(p)]["last_txid"] for p in PARTITIONS
    )
    assert {f: os.stat(f).st_ino for f in sealed_before} == sealed_before
    assert cli_json("backup", "create", "-c", config, "--to", url)["published"] is False
    report = cli_json("backup", "verify", url)
    assert report["ok"] and report["records"] == len(rows)

    key = listed["cluster_key"]
    whole = tmp_path / "whole"
    cli_json("backup", "restore", url, "--to", str(whole))
    assert inspect_verify(whole).ok
    assert restored_rows(whole, key, NUM_PARTITIONS) == rows

    cut = tmp_path / "cut"
    restored = cli_json("backup", "restore", url, "--to", str(cut), "--to-txid", "41", "-p", "1")
    assert restored["partitions"] == {"1": {"first_txid": 0, "last_txid": 41}}
    assert inspect_verify(cut).ok
    assert restored_rows(cut, key, NUM_PARTITIONS) == [r for r in rows if r[0] == 1 and r[1] <= 41]
    empty = run_waltz_cli(
        "backup", "restore", url, "--to", str(tmp_path / "empty"), "-p", str(EMPTY_PARTITION)
    )
    assert empty.returncode == 0, empty.stderr
    assert f"partition {EMPTY_PARTITION}: no transactions (empty partition)" in empty.stdout

    # Damage is named, exit 1; a restore refuses a damaged backup and a non-empty directory.
    segment = sorted((tmp_path / "backup" / "0").glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))
    before = _snapshot(tmp_path / "backup")
    bad = run_waltz_cli("backup", "verify", url)
    assert bad.returncode == 1 and f"0/{segment.name}: checksum mismatch" in bad.stdout
    assert run_waltz_cli("backup", "list", url).returncode == 0
    assert _snapshot(tmp_path / "backup") == before  # checks never write (issue 31)
    refused = run_waltz_cli("backup", "restore", url, "--to", str(tmp_path / "again"))
    assert refused.returncode == 1 and "damaged" in refused.stderr and "Traceback" not in refused.stderr
    refused = run_waltz_cli("backup", "restore", url, "--to", str(whole))
    assert refused.returncode == 1 and "not empty" in refused.stderr


def test_a_storage_node_restored_from_a_backup_catches_up(cluster: LocalCluster, tmp_path: Path) -> None:
    url = str(tmp_path / "backup")
    config = str(cluster.client_config_path)
    cli_json("backup", "create", "-c", config, "--to", url)
    lines(cluster, "after-backup", 25)
    node = cluster.storages[0]
    node.kill()
    data = node.directory / "data"
    shutil.rmtree(data)
    cli_json("backup", "restore", url, "--to", str(data))
    assert inspect_verify(data).ok
    node.start()
    lines(cluster, "after-restore", 25)  # acknowledged while the restored node catches up
    cluster.wait_verified()
    rows = tailed(cluster, PARTITIONS)
    texts = {bytes.fromhex(r[-1]).decode() for r in rows}
    for tag, count in (("first", 60), ("after-backup", 25), ("after-restore", 25)):
        assert all(f"{tag}-{p}-{i}" in texts for p in PARTITIONS for i in range(count))
    for storage in cluster.storages:
        storage.stop()
    try:
        key = cli_json("backup", "list", url)["cluster_key"]
        sums = [
            replica_checksums(s.directory / "data", uuid.UUID(key), NUM_PARTITIONS).checksums
            for s in cluster.storages
        ]
        assert sums[0] == sums[1] == sums[2]
    finally:
        for storage in cluster.storages:
            storage.start()
        cluster.wait_verified()


def _killed_create(access: ClusterAccess, url: str, kill_at: int, scratch: Path) -> None:
    os.environ[KILL_AT_ENV] = str(kill_at)
    # A killed run leaves its staging directory behind, as any process killed mid-way would:
    # under the test's own directory, not the machine's temp dir.
    tempfile.tempdir = str(scratch)
    create_backup(access, url, segment_size_bytes=int(SEGMENT_BYTES))


def test_a_backup_killed_at_every_file_operation_is_never_half_visible(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    url = str(tmp_path / "backup")
    access = ClusterAccess(ZooKeeperSettings.from_config(Config.load(cluster.client_config_path)))
    create_backup(access, url, segment_size_bytes=int(SEGMENT_BYTES))
    before = verify_backup(url)
    assert before.ok
    lines(cluster, "killed", 40)
    committed = len(tailed(cluster, PARTITIONS))
    fork = multiprocessing.get_context("fork")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    kill_at = 0
    while True:
        kill_at += 1
        child = fork.Process(target=_killed_create, args=(access, url, kill_at, scratch))
        child.start()
        child.join(120)
        report = verify_backup(url)
        assert report.ok, (kill_at, report.problems)
        # Either the previous backup or the whole new one: never a part of the run.
        assert report.records in (before.records, committed), (kill_at, report.records)
        if child.exitcode == 0:
            break
        assert child.exitcode == -9, child.exitcode
        assert kill_at < 200
    assert kill_at - 1 >= KILL_POINTS_AT_LEAST
    assert report.records == committed


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_s3_url("backups", "waltz", monkeypatch) as url:
        yield url


def test_backup_to_s3_and_back(cluster: LocalCluster, s3_url: str, tmp_path: Path) -> None:
    config = str(cluster.client_config_path)
    first = cli_json("backup", "create", "-c", config, "--to", s3_url, "--segment-size-bytes", SEGMENT_BYTES)
    lines(cluster, "s3", 20)
    second = cli_json("backup", "create", "-c", config, "--to", s3_url, "--segment-size-bytes", SEGMENT_BYTES)
    rows = tailed(cluster, PARTITIONS)
    assert second["records_added"] == len(rows) - first["records_added"]
    assert cli_json("backup", "verify", s3_url)["records"] == len(rows)
    assert cli_json("backup", "list", s3_url)["sequence"] == 2
    target = tmp_path / "from-s3"
    cli_json("backup", "restore", s3_url, "--to", str(target))
    assert inspect_verify(target).ok
    key = cli_json("backup", "list", s3_url)["cluster_key"]
    assert restored_rows(target, key, NUM_PARTITIONS) == rows
