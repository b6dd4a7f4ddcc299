"""Commands that check never write (issue 31): every file's hash and every directory's listing are
the same before and after each read-only command, on clean and damaged copies of a storage
directory written by a real storage node process and by our storage engine in-process (several
segments per partition), and on the original's disk vectors; damage exits 1 with one line naming
it; only `storage checksum --repair` repairs."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from storage_node_support import ISSUED_SESSION_ID, make_records, start_storage_node
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_engine.disk.control_reader import read_control_file
from waltz_engine.storage import StorageManager
from waltz_engine.storage.admin_ops import StorageAdminError, replica_checksums
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.connection import ZooKeeperSettings, connect

KEY = uuid.UUID(int=0x31_0_31)
NUM_PARTITIONS = 2
RECORDS = 60
SEGMENT_THRESHOLD_BYTES = 1024  # several segments per partition
VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "disk"


def snapshot(directory: Path) -> dict[str, str]:
    """Every file's SHA-256 and every directory, by path under ``directory``."""
    return {
        str(p.relative_to(directory)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
    }


@pytest.fixture(scope="module")
def node_written(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> tuple[Path, str]:
    """A storage directory written by a real storage node process (stopped): (directory, root)."""
    work = tmp_path_factory.mktemp("node")
    config = {"storage.segment.size.threshold": SEGMENT_THRESHOLD_BYTES}
    node = start_storage_node(zookeeper, work, NUM_PARTITIONS, extra_config=config)
    try:

        async def write() -> None:
            client = node.data_client()
            await client.open()
            try:
                for partition in range(NUM_PARTITIONS):
                    for first in range(0, RECORDS, 10):
                        if first == RECORDS - 10:
                            # The low-water mark lags the last append, as on a live node: the
                            # last records are not known durable, and a torn one is a tail to cut.
                            await client.set_low_water_mark(ISSUED_SESSION_ID, partition, first - 1)
                        records = make_records(first, 10, partition)
                        await client.append(ISSUED_SESSION_ID, partition, records)
            finally:
                await client.close()

        node.run(write())
    finally:
        node.close()
    assert len(list((node.directory / "0").glob("*.seg"))) >= 4
    return node.directory, node.cluster_root


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage directory as our engine writes it, closed cleanly."""
    directory = tmp_path_factory.mktemp("written") / "storage"
    directory.mkdir()
    with StorageManager(
        directory, KEY, NUM_PARTITIONS, segment_size_threshold_bytes=SEGMENT_THRESHOLD_BYTES
    ) as manager:
        manager.set_partition_assignment(range(NUM_PARTITIONS), True)
        for partition in range(NUM_PARTITIONS):
            for first in range(0, RECORDS, 10):
                manager.partition(partition).append(make_records(first, 10, partition))
    assert len(list((directory / "0").glob("*.seg"))) >= 4
    return directory


def _segments(directory: Path) -> list[Path]:
    return sorted((directory / "0").glob("*.seg"))


def torn_last_record(directory: Path) -> None:
    last = _segments(directory)[-1]
    last.write_bytes(last.read_bytes()[:-5])


def truncated_index(directory: Path) -> None:
    index = _segments(directory)[-1].with_suffix(".idx")
    index.write_bytes(index.read_bytes()[:-16])


def missing_segment(directory: Path) -> None:
    middle = _segments(directory)[1]
    middle.unlink()
    middle.with_suffix(".idx").unlink()


def interrupted_files(directory: Path) -> None:
    last = _segments(directory)[-1]
    shutil.copy(last.with_suffix(".idx"), directory / "0" / f"{99999:019d}.idx")  # an orphan index
    shutil.copy(last, last.with_name(last.name + ".refill"))  # an unfinished refill


def missing_partition_directory(directory: Path) -> None:
    shutil.rmtree(directory / "1")


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "torn last record": (torn_last_record, "torn tail"),
    "truncated index": (truncated_index, "the index lists"),
    "missing segment": (missing_segment, "the index lists"),
    "interrupted files": (interrupted_files, "interrupted"),
    "missing partition directory": (missing_partition_directory, "partition directory 1 is missing"),
}


@pytest.fixture(scope="module")
def roots(zookeeper: str) -> Iterator[dict[str, str]]:
    """A cluster root in ZooKeeper per storage key the tests read (ours, the Java vectors')."""
    keys = {"ours": (KEY, NUM_PARTITIONS)}
    for name in ("clean", "damaged"):
        header = read_control_file(VECTORS / name / "storage").header
        keys[name] = (header.key, header.num_partitions)
    result = {}
    with connect(ZooKeeperSettings(zookeeper, "/")) as client:
        for name, (key, partitions) in keys.items():
            root = f"/read-only-{name}-{uuid.uuid4().hex[:8]}"
            create_cluster(client, root, name, partitions, key)
            result[name] = root
    yield result


def checksum(zookeeper: str, root: str, directory: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["storage", "checksum", str(directory), "-z", zookeeper, "-r", root, *extra]
    )
    return result.exit_code, result.output


def read_only_commands(directory: Path) -> list[list[str]]:
    """The read-only commands that take a storage directory (beside `storage checksum`)."""
    a_segment = next(directory.rglob("*.seg"))
    return [
        ["inspect", "verify", str(directory)],
        ["inspect", "control", str(directory)],
        ["inspect", "stats", str(directory)],
        ["inspect", "segment", str(a_segment)],
    ]


@pytest.mark.parametrize("source", ["engine", "node"])
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_checks_of_a_damaged_copy_write_nothing_and_name_the_damage(
    damage: str,
    source: str,
    written: Path,
    node_written: tuple[Path, str],
    roots: dict[str, str],
    zookeeper: str,
    tmp_path: Path,
) -> None:
    original, root = (written, roots["ours"]) if source == "engine" else node_written
    damaged = tmp_path / "storage"
    shutil.copytree(original, damaged)
    make, named = DAMAGES[damage]
    make(damaged)
    before = snapshot(damaged)
    code, output = checksum(zookeeper, root, damaged)
    assert code == 1, output
    assert named in output and len(output.strip().splitlines()) == 1, output
    assert snapshot(damaged) == before
    for command in read_only_commands(damaged):
        CliRunner().invoke(app, command)
        assert snapshot(damaged) == before, command


def test_a_clean_copy_checks_and_only_repair_writes(
    written: Path, node_written: tuple[Path, str], roots: dict[str, str], zookeeper: str, tmp_path: Path
) -> None:
    for directory, root in ((written, roots["ours"]), node_written):
        before = snapshot(directory)
        code, output = checksum(zookeeper, root, directory)
        assert code == 0 and "segment checksums" in output, output
        assert snapshot(directory) == before

    # --repair does what a node's start does, says what, and the copy then checks clean.
    torn = tmp_path / "storage"
    shutil.copytree(written, torn)
    torn_last_record(torn)
    code, output = checksum(zookeeper, roots["ours"], torn, "--repair")
    assert code == 0 and "repaired: partition 0: " in output and "torn tail" in output, output
    assert snapshot(torn) != snapshot(written)
    assert checksum(zookeeper, roots["ours"], torn)[0] == 0


@pytest.mark.parametrize("vector", ["clean", "damaged"])
def test_the_original_disk_vectors_are_read_without_a_write(
    vector: str, roots: dict[str, str], zookeeper: str, tmp_path: Path
) -> None:
    copy = tmp_path / "storage"
    shutil.copytree(VECTORS / vector / "storage", copy)
    before = snapshot(copy)
    code, output = checksum(zookeeper, roots[vector], copy)
    assert code == (0 if vector == "clean" else 1), output
    if vector == "damaged":
        assert "torn tail" in output and len(output.strip().splitlines()) == 1, output
    assert snapshot(copy) == before
    for command in read_only_commands(copy):
        CliRunner().invoke(app, command)
        assert snapshot(copy) == before, command


def test_the_read_only_open_refuses_a_running_node_and_a_directory_without_control_file(
    written: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "storage"
    shutil.copytree(written, copy)
    # A node holds the directory: the shared lock of the read-only open is refused.
    with StorageManager(copy, KEY, NUM_PARTITIONS), pytest.raises(Exception, match="in use"):
        replica_checksums(copy, KEY, NUM_PARTITIONS)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StorageAdminError, match="not a storage directory"):
        replica_checksums(empty, KEY, NUM_PARTITIONS)
    assert list(empty.iterdir()) == []
