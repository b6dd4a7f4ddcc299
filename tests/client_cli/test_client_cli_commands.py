"""`waltz append`, `waltz tail` and `waltz client ...` against a real local cluster."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import local_cluster, run_waltz_cli, waltz_cli_command

from waltz_engine.devcluster import LocalCluster

TAIL_LINE_WAIT_S = 5.0
MAX_APPENDS_UNTIL_SEEN = 10
PROCESS_EXIT_TIMEOUT_S = 30.0
FAST_TIMEOUT_MS = "3000"
# Partition 0 is kept for validation data (data == transaction id); the feed tests use the others.
VALIDATE_PARTITION = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: str) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory, storages=2, servers=1, partitions=4, zookeeper=zookeeper) as c:
        yield c


def waltz(cluster: LocalCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_waltz_cli(*args, "--config", str(cluster.client_config_path), stdin=stdin)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def tail_json(cluster: LocalCluster, partition: int, *extra: str) -> list[dict[str, object]]:
    out = ok(waltz(cluster, "tail", "-p", str(partition), "--no-follow", "--json", "--data", *extra))
    return [json.loads(line) for line in out.splitlines()]


def test_append_then_tail_round_trip(cluster: LocalCluster) -> None:
    first = int(ok(waltz(cluster, "append", "-p", "1", "--header", "7", "--lock", "acct:42", "hello")))
    lines = ok(waltz(cluster, "append", "-p", "1", "-", stdin="one\ntwo\n")).split()
    assert [int(t) for t in lines] == [first + 1, first + 2]

    records = tail_json(cluster, 1)
    assert [(r["transaction_id"], r["header"], bytes.fromhex(str(r["data_hex"]))) for r in records] == [
        (first, 7, b"hello"),
        (first + 1, 0, b"one"),
        (first + 2, 0, b"two"),
    ]
    assert set(records[0]) == {"transaction_id", "header", "client_id", "generation", "seq_num", "data_hex"}
    assert records[1]["client_id"] == records[2]["client_id"] != records[0]["client_id"]

    assert tail_json(cluster, 1, "--from", str(first + 2)) == records[2:]
    assert ok(waltz(cluster, "client", "high-water-mark", "-p", "1")) == (
        f"Partition 1 current high watermark: {first + 2}\n"
    )
    plain = ok(waltz(cluster, "tail", "-p", "1", "--no-follow")).splitlines()
    assert plain[0].startswith(f"{first}\theader=7\treqId=")


def test_tail_decoder(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "upper_decoder.py").write_text("def decode(data):\n    return data.decode().upper()\n")
    ok(waltz(cluster, "append", "-p", "3", "shout"))
    result = run_waltz_cli(
        "tail", "-p", "3", "--no-follow", "--decoder", "upper_decoder:decode",
        "--config", str(cluster.client_config_path), cwd=tmp_path,
    )  # fmt: skip
    assert ok(result).rstrip().endswith("data=SHOUT")


def _read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def test_tail_from_latest_sees_only_new_transactions(cluster: LocalCluster) -> None:
    old = int(ok(waltz(cluster, "append", "-p", "2", "old")))
    tail = subprocess.Popen(
        waltz_cli_command("tail", "-p", "2", "--from-latest", "--json",
         "--config", str(cluster.client_config_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(tail.stdout, lines), daemon=True).start()
    try:
        # The tail may start before or after an append: append until it shows one.
        appended: list[int] = []
        seen = None
        for _ in range(MAX_APPENDS_UNTIL_SEEN):
            appended.append(int(ok(waltz(cluster, "append", "-p", "2", "new"))))
            try:
                seen = json.loads(lines.get(timeout=TAIL_LINE_WAIT_S))
                break
            except queue.Empty:
                continue
        assert seen is not None, "tail --from-latest printed nothing"
        assert seen["transaction_id"] in appended and seen["transaction_id"] > old
    finally:
        tail.send_signal(signal.SIGINT)
        code = tail.wait(PROCESS_EXIT_TIMEOUT_S)
    assert code == 130
    assert "Traceback" not in (tail.stderr.read() if tail.stderr else "")


def test_validate_producer_consumer_and_a_broken_log(cluster: LocalCluster) -> None:
    ok(waltz(cluster, "client", "validate", "-tpc", "30", "-nc", "3", "-i", "5"))
    hwm_line = ok(waltz(cluster, "client", "high-water-mark", "-p", str(VALIDATE_PARTITION)))
    assert hwm_line == f"Partition {VALIDATE_PARTITION} current high watermark: 89\n"

    ok(waltz(cluster, "client", "create-producer", "-tpc", "10", "-i", "5"))
    ok(waltz(cluster, "client", "create-consumer", "-tpc", "100"))
    # Every committed transaction carries its own id.
    records = tail_json(cluster, VALIDATE_PARTITION)
    assert [int.from_bytes(bytes.fromhex(str(r["data_hex"])), "big") for r in records] == list(range(100))

    # One transaction whose data is not its id: validation must fail and say why.
    ok(waltz(cluster, "append", "-p", str(VALIDATE_PARTITION), "garbage"))
    broken = waltz(cluster, "client", "validate", "-tpc", "3", "-nc", "1", "-i", "5")
    assert broken.returncode == 1
    assert broken.stderr.startswith(
        "error: Transaction validation failed: optimistic locking validation failed"
    )
    assert "transaction 100 " in broken.stderr


def test_clear_errors(cluster: LocalCluster, tmp_path: Path) -> None:
    bad_partition = waltz(cluster, "append", "-p", "9", "x")
    assert bad_partition.returncode == 1
    assert "Partition 9 is not valid" in bad_partition.stderr
    no_config = run_waltz_cli("tail", "-p", "0", cwd=tmp_path)
    assert no_config.returncode == 1
    assert "no --config given and no .waltz-dev/client.yml" in no_config.stderr
    bad_lock = waltz(cluster, "append", "-p", "1", "--lock", "nolockid", "x")
    assert "lock must be NAME:ID" in bad_lock.stderr


def test_server_down_gives_one_line_errors_within_the_timeout(cluster: LocalCluster) -> None:
    server = cluster.servers[0]
    server.stop()
    try:
        for command in (["append", "-p", "1", "x"], ["tail", "-p", "1"], ["tail", "-p", "1", "--no-follow"]):
            result = waltz(cluster, *command, "--timeout-ms", FAST_TIMEOUT_MS)
            assert result.returncode == 1, result
            assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
            assert "within 3000 ms" in result.stderr
    finally:
        server.start()
        cluster.wait_verified()
    assert int(ok(waltz(cluster, "append", "-p", "1", "back")).strip()) >= 0


def test_tail_shows_printable_data_as_text_and_the_rest_as_hex() -> None:
    from waltz_cli.commands.feed import _readable

    assert _readable(b"hello, waltz") == '"hello, waltz"'
    assert _readable("héllo ✓".encode()) == '"héllo ✓"'
    assert _readable(b"\x00\x01") == "0001"
    assert _readable(b"\xff\xfe") == "fffe"
