"""`waltz append`, `waltz tail` and `waltz client ...` against a real local cluster."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from cluster_support import CLI_TIMEOUT_S, module_cluster, run_waltz_cli, waltz_cli_command
from testkit import free_tcp_port

from waltz_engine.ops.devcluster import LocalCluster

TAIL_LINE_WAIT_S = 5.0
MAX_APPENDS_UNTIL_SEEN = 10
PROCESS_EXIT_TIMEOUT_S = 30.0
CLI_WAIT_S = 120.0
FAST_TIMEOUT_MS = "3000"
MOUNT_TIMEOUT_MS = "2000"
BLOCKER_TIMEOUT_MS = "60000"
NEVER_MS = str(int(CLI_TIMEOUT_S * 1000 * 10))  # longer than run_waltz_cli waits for a command
METRICS_WAIT_S = 30.0
POLL_S = 0.1
# Partition 0 is kept for validation data (data == transaction id); the feed tests use the others.
VALIDATE_PARTITION = 0


cluster = module_cluster(storages=2, partitions=4)


def waltz(cluster: LocalCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_waltz_cli(*args, "--config", str(cluster.client_config_path), stdin=stdin)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def committed(out: str) -> list[int]:
    """The transaction ids `waltz append` printed ("partition P: committed transaction T" lines)."""
    lines = out.splitlines()
    assert all(re.fullmatch(r"partition \d+: committed transaction \d+", line) for line in lines), out
    return [int(line.split()[-1]) for line in lines]


def tail_json(cluster: LocalCluster, partitions: int | str, *extra: str) -> list[dict[str, object]]:
    out = ok(waltz(cluster, "tail", "-p", str(partitions), "--no-follow", "--json", "--data", *extra))
    return [json.loads(line) for line in out.splitlines()]


def test_append_then_tail_round_trip(cluster: LocalCluster) -> None:
    [first] = committed(ok(waltz(cluster, "append", "-p", "1", "--header", "7", "--lock", "acct:42", "hi")))
    more = committed(ok(waltz(cluster, "append", "-p", "1", "-", stdin="one\ntwo\n")))
    assert more == [first + 1, first + 2]

    records = tail_json(cluster, 1)
    assert [(r["transaction_id"], r["header"], bytes.fromhex(str(r["data_hex"]))) for r in records] == [
        (first, 7, b"hi"),
        (first + 1, 0, b"one"),
        (first + 2, 0, b"two"),
    ]
    assert set(records[0]) == {
        "partition", "transaction_id", "header", "client_id", "generation", "seq_num", "data", "data_hex",
    }  # fmt: skip
    assert [(r["partition"], r["data"]) for r in records] == [(1, "hi"), (1, "one"), (1, "two")]
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


def test_a_record_the_tail_decoder_cannot_read_shows_its_error_and_the_tail_goes_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    (tmp_path / "json_decoder.py").write_text(
        "import json\n\ndef decode(data):\n    return json.loads(data)\n"
    )
    first, bad, last = committed(
        ok(waltz(cluster, "append", "-p", "3", "-", stdin='{"a": 1}\nnot json\n[2]\n'))
    )
    common = ("--no-follow", "--from", str(first), "--decoder", "json_decoder:decode")
    where = ("--config", str(cluster.client_config_path))
    text = run_waltz_cli("tail", "-p", "3", *common, *where, cwd=tmp_path)
    lines = ok(text).splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(first), str(bad), str(last)]
    assert lines[1].endswith(
        '\tdecode_error=JSONDecodeError: Expecting value: line 1 column 1 (char 0)\tdata="not json"'
    )
    assert lines[2].endswith("\tdata=[2]") and text.stderr == ""
    documents = [json.loads(line) for line in ok(run_waltz_cli("tail", "-p", "3", *common, "--json", *where,
                                                               cwd=tmp_path)).splitlines()]  # fmt: skip
    assert [d.get("decoded") for d in documents] == [{"a": 1}, None, [2]]
    assert documents[1]["decode_error"].startswith("JSONDecodeError: ") and "decoded" not in documents[1]


def _read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def _following_tail(cluster: LocalCluster, *args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """A `waltz tail ARGS` process and the queue its output lines arrive in."""
    tail = subprocess.Popen(
        waltz_cli_command("tail", *args, "--config", str(cluster.client_config_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(tail.stdout, lines), daemon=True).start()
    return tail, lines


def test_tail_from_latest_sees_only_new_transactions(cluster: LocalCluster) -> None:
    [old] = committed(ok(waltz(cluster, "append", "-p", "2", "old")))
    tail, lines = _following_tail(cluster, "-p", "2", "--from-latest", "--json")
    try:
        # The tail may start before or after an append: append until it shows one.
        appended: list[int] = []
        seen = None
        for _ in range(MAX_APPENDS_UNTIL_SEEN):
            appended += committed(ok(waltz(cluster, "append", "-p", "2", "new")))
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

    # The original's spellings are hidden aliases: -tpc, --interval (now --interval-ms), -ap.
    ok(waltz(cluster, "client", "create-producer", "-tpc", "10", "--interval", "5", "-ap", "1"))
    ok(waltz(cluster, "client", "create-consumer", "--txn-per-client", "100"))
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
    assert "Partition 9 does not belong to the cluster (it has partitions 0-3)" in bad_partition.stderr
    no_config = run_waltz_cli("tail", "-p", "0", cwd=tmp_path)
    assert no_config.returncode == 1
    assert no_config.stderr.startswith("error: no zookeeper.connectString given: pass --zookeeper")
    assert no_config.stderr.count("\n") == 1 and "waltz dev up" in no_config.stderr
    no_partition = waltz(cluster, "tail", "--no-follow")
    assert no_partition.returncode == 2
    assert (
        no_partition.stderr
        == "error: which partitions? give -p/--partition (e.g. -p 0 or -p 0,2-3) or --all\n"
    )
    both = waltz(cluster, "tail", "-p", "0", "--all")
    assert both.returncode == 2 and both.stderr == "error: give -p/--partition or --all, not both\n"
    bad_range = waltz(cluster, "tail", "-p", "3-1", "--no-follow")
    assert bad_range.returncode == 2
    assert bad_range.stderr == (
        "error: Invalid value for '--partition' / '-p': range '3-1' in '3-1' goes backwards "
        "(see 'waltz tail -h')\n"
    )
    backwards = waltz(cluster, "tail", "-p", "1", "--from", "5", "--to", "4")
    assert backwards.returncode == 2 and backwards.stderr == "error: --to 4 is before --from 5\n"
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
    assert committed(ok(waltz(cluster, "append", "-p", "1", "back")))


def test_tail_shows_printable_data_as_text_and_the_rest_as_hex() -> None:
    from waltz_cli.commands.feed import _readable

    assert _readable(b"hello, waltz") == '"hello, waltz"'
    assert _readable("héllo ✓".encode()) == '"héllo ✓"'
    assert _readable(b"\x00\x01") == "0001"
    assert _readable(b"\xff\xfe") == "fffe"


def _ids(records: list[dict[str, object]]) -> list[tuple[object, object]]:
    """(partition, transaction id) of each record, sorted: across partitions the order is free."""
    return sorted((r["partition"], r["transaction_id"]) for r in records)


def test_tail_several_partitions_to_and_max(cluster: LocalCluster) -> None:
    ok(waltz(cluster, "append", "-p", "1", "-", stdin="many-1a\nmany-1b\n"))
    ok(waltz(cluster, "append", "-p", "3", "-", stdin="many-3a\nmany-3b\n"))
    # --all below sees every partition hold records, whichever tests ran before on this worker.
    for partition in ("0", "2"):
        ok(waltz(cluster, "append", "-p", partition, f"many-{partition}"))
    one = tail_json(cluster, 1)
    three = tail_json(cluster, 3)
    both = tail_json(cluster, "1,3")
    # Each partition in order, interleaved as they arrive: the same records as one by one.
    assert [r for r in both if r["partition"] == 1] == one
    assert [r for r in both if r["partition"] == 3] == three
    assert len(both) == len(one) + len(three)
    every = ok(waltz(cluster, "tail", "--all", "--no-follow", "--json")).splitlines()
    assert _ids([json.loads(line) for line in every]) == _ids(tail_json(cluster, "0-3"))
    assert {json.loads(line)["partition"] for line in every} == {0, 1, 2, 3}

    # --to: up to that id (inclusive) in every partition; it ends even while following.
    upto = ok(waltz(cluster, "tail", "-p", "1,3", "--to", "1", "--json")).splitlines()
    assert _ids([json.loads(line) for line in upto]) == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert _ids(tail_json(cluster, "1,3", "--from", "1", "--to", "1")) == [(1, 1), (3, 1)]
    # --max: that many in all, then stop (also while following).
    assert len(tail_json(cluster, "1,3", "--max", "3")) == 3
    assert len(ok(waltz(cluster, "tail", "--all", "--max", "2")).splitlines()) == 2

    # Text lines say the partition when several are tailed, and only then.
    several = ok(waltz(cluster, "tail", "-p", "1,3", "--no-follow", "--data")).splitlines()
    assert len(several) == len(both)
    assert all(line.startswith(("partition=1\t", "partition=3\t")) for line in several), several
    last_of_three = f"partition=3\t{three[-1]['transaction_id']}\theader=0\treqId="
    assert [line for line in several if line.startswith(last_of_three)][0].endswith('\tdata="many-3b"')
    single = ok(waltz(cluster, "tail", "-p", "3", "--no-follow")).splitlines()
    assert len(single) == len(three) and not any(line.startswith("partition=") for line in single)


def test_tail_output_to_a_pipe_is_not_cut_at_80_columns(cluster: LocalCluster) -> None:
    long_text = "w" * 300
    [txid] = committed(ok(waltz(cluster, "append", "-p", "3", long_text)))
    lines = ok(waltz(cluster, "tail", "-p", "3", "--from", str(txid), "--no-follow", "--data")).splitlines()
    assert len(lines) == 1 and lines[0].endswith(f'data="{long_text}"')


def test_append_and_high_water_mark_json(cluster: LocalCluster) -> None:
    out = ok(waltz(cluster, "append", "-p", "3", "--json", "-", stdin="json-a\njson-b\n"))
    documents = [json.loads(line) for line in out.splitlines()]
    assert [set(d) for d in documents] == [{"partition", "transaction_id"}] * 2
    first = documents[0]["transaction_id"]
    assert documents == [
        {"partition": 3, "transaction_id": first},
        {"partition": 3, "transaction_id": first + 1},
    ]
    mark = json.loads(ok(waltz(cluster, "client", "high-water-mark", "-p", "3", "--json")))
    assert mark == {"partition": 3, "high_water_mark": first + 1}
    records = tail_json(cluster, 3, "--from", str(first))
    assert [(r["data"], r["data_hex"]) for r in records] == [
        ("json-a", b"json-a".hex()),
        ("json-b", b"json-b".hex()),
    ]


def test_zookeeper_and_root_flags_and_environment_find_the_cluster(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    where = ["-z", cluster.zookeeper, "-r", cluster.cluster_root]
    [txid] = committed(ok(run_waltz_cli("append", "-p", "1", "by flags", *where, cwd=tmp_path)))
    shown = ok(
        run_waltz_cli("tail", "-p", "1", "--from", str(txid), "--no-follow", "--data", *where, cwd=tmp_path)
    )
    assert shown.rstrip().endswith('data="by flags"')
    env = {"WALTZ_ZOOKEEPER": cluster.zookeeper, "WALTZ_CLUSTER_ROOT": cluster.cluster_root}
    mark = ok(run_waltz_cli("client", "high-water-mark", "-p", "1", "--json", cwd=tmp_path, env=env))
    assert json.loads(mark)["high_water_mark"] >= txid
    # The original ClientCli's --cli-config-path is a hidden alias of --config.
    aliased = run_waltz_cli(
        "client",
        "high-water-mark",
        "-p",
        "1",
        "--cli-config-path",
        str(cluster.client_config_path),
        cwd=tmp_path,
    )
    assert ok(aliased).startswith("Partition 1 current high watermark: ")


def test_a_closed_pipe_ends_tail_quietly(cluster: LocalCluster) -> None:
    ok(waltz(cluster, "append", "-p", "2", "-", stdin="piped\n" * 50))
    tail = subprocess.Popen(
        waltz_cli_command("tail", "-p", "2", "--data", "--json", "--config", str(cluster.client_config_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert tail.stdout is not None and tail.stderr is not None
    head = subprocess.Popen(["head", "-n", "1"], stdin=tail.stdout, stdout=subprocess.PIPE, text=True)
    tail.stdout.close()  # head alone reads it now
    try:
        first, _ = head.communicate(timeout=PROCESS_EXIT_TIMEOUT_S)
        assert json.loads(first)["partition"] == 2
        # tail follows: if it has not met the closed pipe yet, the next transaction makes it.
        ok(waltz(cluster, "append", "-p", "2", "after head"))
        code = tail.wait(PROCESS_EXIT_TIMEOUT_S)
    finally:
        if tail.poll() is None:
            tail.kill()
    assert code == 0
    assert tail.stderr.read() == ""


def test_zookeeper_down_gives_one_line_errors(cluster: LocalCluster, tmp_path: Path) -> None:
    """Nothing listens at the address: every command fails at once, not after its timeout (which
    is longer than the test waits for a command)."""
    nobody = f"127.0.0.1:{free_tcp_port()}"
    for command in (
        ["append", "-p", "1", "x"],
        ["tail", "-p", "1"],
        ["tail", "--all", "--no-follow"],
        ["client", "high-water-mark", "-p", "1"],
        ["zk", "list", "--connect-timeout-ms", NEVER_MS],
    ):
        timeout = [] if "zk" in command else ["--timeout-ms", NEVER_MS]
        result = run_waltz_cli(*command, "-z", nobody, "-r", cluster.cluster_root, *timeout, cwd=tmp_path)
        assert result.returncode == 1, result
        assert result.stderr == (
            f"error: cannot connect to ZooKeeper at {nobody} ({nobody} refused the connection): "
            "is it running there? (`waltz dev up` starts a local cluster)\n"
        ), command
        assert result.stdout == ""


def _appends_received(cluster: LocalCluster, partition: int) -> int:
    """The server's count of append requests for ``partition`` (its /metrics)."""
    url = f"http://127.0.0.1:{cluster.servers[0].jetty_port}/metrics"
    with urllib.request.urlopen(url, timeout=PROCESS_EXIT_TIMEOUT_S) as response:  # noqa: S310 (http)
        meters = json.loads(response.read())["meters"]
    return int(meters.get(f"waltz-server.partition-{partition}.transaction", {}).get("count", 0))


def test_a_mount_time_out_is_one_line(cluster: LocalCluster) -> None:
    """With the storage nodes hung, one append waits in the partition's queue; a second client's
    mount waits behind it and times out: one line, not "Future exception was never retrieved"."""
    partition = 3
    server = cluster.servers[0]
    for storage in cluster.storages:
        storage.pause()
    blocker = None
    try:
        before = _appends_received(cluster, partition)
        blocker = subprocess.Popen(
            waltz_cli_command("append", "-p", str(partition), "blocker", "--timeout-ms", BLOCKER_TIMEOUT_MS,
                              "--config", str(cluster.client_config_path)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + METRICS_WAIT_S
        while _appends_received(cluster, partition) == before:
            assert time.monotonic() < deadline, "the blocking append never reached the server"
            time.sleep(POLL_S)
        result = waltz(cluster, "append", "-p", str(partition), "x", "--timeout-ms", MOUNT_TIMEOUT_MS)
        assert result.returncode == 1, result
        assert result.stderr == (
            f"error: partition {partition} was not mounted within {MOUNT_TIMEOUT_MS} ms "
            f"({server.connect_string})\n"
        )
    finally:
        for storage in cluster.storages:
            storage.resume()
        if blocker is not None:
            out, err = blocker.communicate(timeout=CLI_WAIT_S)
    assert blocker is not None and blocker.returncode == 0, err
    assert committed(out)
    cluster.wait_verified()


def test_partition_flag_takes_one_id_where_a_command_acts_on_one(cluster: LocalCluster) -> None:
    for command in (["append", "-p", "0-3", "x"], ["append", "-p", "abc", "x"]):
        result = waltz(cluster, *command)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result
        assert "is not one partition id: this command acts on one partition (e.g. -p 3)" in result.stderr
    for command in (["tail", "-p", "abc"], ["client", "high-water-mark", "-p", "1,x"]):
        result = waltz(cluster, *command)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result
        assert "is not a partition id or a range like 0-6" in result.stderr


def test_high_water_mark_of_a_list_and_of_every_partition(cluster: LocalCluster) -> None:
    every = [json.loads(line) for line in ok(waltz(cluster, "client", "high-water-mark", "--all", "--json"))
             .splitlines()]  # fmt: skip
    assert [m["partition"] for m in every] == [0, 1, 2, 3]
    some = ok(waltz(cluster, "client", "high-water-mark", "-p", "1,3")).splitlines()
    assert some == [f"Partition {p} current high watermark: {every[p]['high_water_mark']}" for p in (1, 3)]


def _marks(cluster: LocalCluster) -> dict[int, int]:
    out = ok(waltz(cluster, "client", "high-water-mark", "--all", "--json"))
    return {m["partition"]: m["high_water_mark"] for m in map(json.loads, out.splitlines())}


def test_tail_no_follow_skips_partitions_short_of_from_with_a_note(cluster: LocalCluster) -> None:
    ok(waltz(cluster, "append", "-p", "3", "-", stdin="long-1\nlong-2\n"))
    marks = _marks(cluster)
    start = marks[3]
    shorter = [p for p in (1, 2, 3) if marks[p] < start]
    assert shorter, marks  # partition 3 leads after the two appends (their order is by test)
    result = waltz(cluster, "tail", "-p", "1-3", "--from", str(start), "--no-follow", "--json")
    assert result.returncode == 0, result.stderr
    printed = [(r["partition"], r["transaction_id"]) for r in map(json.loads, result.stdout.splitlines())]
    assert (3, start) in printed and all(p not in shorter for p, _ in printed)
    assert result.stderr.splitlines() == [
        f"note: partition {p} skipped: its transactions are 0..{marks[p]}, none at or after --from {start}"
        for p in shorter
    ]


def test_tail_follow_waits_for_a_from_beyond_the_end(cluster: LocalCluster) -> None:
    """Partition 1 reaches --from, partition 2 is two short: once partition 1's line is out the
    tail has read both marks, and partition 2's transaction --from is printed when it comes."""
    marks = _marks(cluster)
    missing = marks[2] + 2 - marks[1]
    if missing > 0:
        ok(waltz(cluster, "append", "-p", "1", "-", stdin="lead\n" * missing))
    wanted = marks[2] + 2
    tail, lines = _following_tail(cluster, "-p", "1,2", "--from", str(wanted), "--json", "--data")
    try:
        first = json.loads(lines.get(timeout=CLI_WAIT_S))
        assert (first["partition"], first["transaction_id"]) == (1, wanted)
        assert committed(ok(waltz(cluster, "append", "-p", "2", "-", stdin="w1\nw2\n")))[-1] == wanted
        later = json.loads(lines.get(timeout=CLI_WAIT_S))
        while later["partition"] == 1:  # the rest of partition 1 (bounded by its length)
            later = json.loads(lines.get(timeout=CLI_WAIT_S))
        assert (later["partition"], later["transaction_id"], later["data"]) == (2, wanted, "w2")
    finally:
        tail.send_signal(signal.SIGINT)
        code = tail.wait(PROCESS_EXIT_TIMEOUT_S)
    assert code == 130, tail.stderr.read() if tail.stderr else ""


def test_tail_json_carries_utf8_data_as_text_and_always_hex() -> None:
    from waltz_engine.common.reqid import ReqId
    from waltz_engine.ops.client_tools import TailedTransaction

    req_id = ReqId(1, 2, 3, 4)
    text = TailedTransaction(3, 7, 0, req_id, "héllo\n✓".encode()).to_json()
    assert text == {
        "partition": 3, "transaction_id": 7, "header": 0, "client_id": 1, "generation": 2, "seq_num": 4,
        "data": "héllo\n✓", "data_hex": "68c3a96c6c6f0ae29c93",
    }  # fmt: skip
    binary = TailedTransaction(3, 8, 0, req_id, b"\xff\x00").to_json()
    assert binary["data"] is None and binary["data_hex"] == "ff00"
    assert "data" not in TailedTransaction(3, 9, 0, req_id, None).to_json()
