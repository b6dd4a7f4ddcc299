"""`waltz create-cluster` and `waltz zk ...` metadata commands against a real ZooKeeper."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from testkit import free_tcp_port, read_jsonl
from typer.testing import CliRunner, Result

from waltz_cli.main import app
from waltz_engine.zk.znode_dump import snake_case_keys

VECTOR_ROOT = "/vectors"
DECODED_FIELDS = ("hex", "data_null", "ephemeral", "kind", "decoded")

runner = CliRunner()


def _run(*args: str) -> Result:
    return runner.invoke(app, list(args))


def _ok(*args: str) -> Result:
    result = _run(*args)
    assert result.exit_code == 0, result.output
    return result


def _assert_one_line_error(result: Result, fragment: str, exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.fixture
def where(zookeeper: str, cluster_root: str) -> tuple[str, ...]:
    return ("--zookeeper", zookeeper, "--cluster-root", cluster_root)


def test_cluster_setup_through_a_config_file(tmp_path: Path, zookeeper: str, cluster_root: str) -> None:
    config = tmp_path / "tools.yml"
    config.write_text(
        f"zookeeper:\n  connectString: {zookeeper}\n  sessionTimeout: 30000\ncluster.root: {cluster_root}\n"
    )
    created = json.loads(
        _ok("create-cluster", "-c", str(config), "-n", "demo", "--partitions", "4", "--json").stdout
    )
    assert created["cluster_root"] == cluster_root and created["num_partitions"] == 4
    assert _ok("zk", "show-cluster-key", "-c", str(config)).stdout.strip() == created["key"]
    key_json = json.loads(_ok("zk", "show-cluster-key", "-c", str(config), "--json").stdout)
    assert key_json == {"key": created["key"], "num_partitions": 4}

    for port in (57280, 57290, 57300):
        storage = f"localhost:{port}"
        _ok("zk", "add-storage-node", "-c", str(config), "-s", storage, "-a", str(port + 1), "-g", "0")
        _ok("zk", "assign-partition", "-c", str(config), "-s", storage, "-p", "0-1,2,3")

    listed = _ok("zk", "list", "-c", str(config)).stdout
    assert created["key"] in listed
    assert "localhost:57290" in listed and "57291" in listed and "0-3" in listed

    dumped = json.loads(_ok("zk", "list", "-c", str(config), "--json").stdout)
    assert dumped["cluster_root"] == cluster_root
    assignment = next(z for z in dumped["znodes"] if z["path"] == f"{cluster_root}/store/assignment")
    assert [e["storage_node_connect_string"] for e in assignment["decoded"]] == [
        "localhost:57300",
        "localhost:57280",
        "localhost:57290",
    ]

    _ok("zk", "unassign-partition", "-c", str(config), "-s", "localhost:57280", "-p", "0-3")
    _ok("zk", "remove-storage-node", "-c", str(config), "-s", "localhost:57280")
    _ok("zk", "delete", "-c", str(config), "-n", "demo")
    _assert_one_line_error(_run("zk", "list", "-c", str(config)), "does not exist")


def _load_moment(client: KazooClient, vectors: Path, moment: str, root: str) -> list[dict[str, Any]]:
    records = [r for r in read_jsonl(vectors / "zk" / "znodes.jsonl") if r["moment"] == moment]
    client.ensure_path(root.rsplit("/", 1)[0])
    for record in sorted(records, key=lambda r: r["path"]):
        data = None if record.get("data_null") else bytes.fromhex(record["hex"])
        client.create(root + record["path"][len(VECTOR_ROOT) :], data, ephemeral=record["ephemeral"])
    return records


@pytest.mark.parametrize("moment", ["c", "d", "e"])
def test_list_decodes_every_vector_znode(
    zk_client: KazooClient, vectors: Path, cluster_root: str, where: tuple[str, ...], moment: str
) -> None:
    records = _load_moment(zk_client, vectors, moment, cluster_root)
    dumped = json.loads(_ok("zk", "list", *where, "--json").stdout)
    ours = {z["path"][len(cluster_root) :]: z for z in dumped["znodes"]}
    assert sorted(ours) == sorted(r["path"][len(VECTOR_ROOT) :] for r in records)
    for record in records:
        # The vectors' field names are the original's camelCase; --json prints them in snake_case.
        expected = {
            field: snake_case_keys(record.get(field, False if field == "data_null" else None))
            for field in DECODED_FIELDS
        }
        got = ours[record["path"][len(VECTOR_ROOT) :]]
        assert {field: got.get(field) for field in DECODED_FIELDS} == expected, record["path"]

    text = _ok("zk", "list", *where).stdout
    assert "dad1ea14-6351-4aca-a2fd-ba73d70294b2" in text
    assert "localhost:57180" in text and "UNRESOLVED" in text
    assert ("1,3" in text) == (moment == "e")  # preferred partitions appear at moment e


def test_cli_error_paths_are_one_line(where: tuple[str, ...]) -> None:
    _ok("create-cluster", *where, "-n", "demo", "--partitions", "4")
    _assert_one_line_error(
        _run("create-cluster", *where, "-n", "demo", "--partitions", "4"), "already exists"
    )
    _assert_one_line_error(_run("create-cluster", *where, "-n", "x", "--partitions", "-1"), "non-negative")
    _assert_one_line_error(
        _run("zk", "assign-partition", *where, "-s", "nowhere:1", "-p", "0"), "Storage node does not exist"
    )
    _ok("zk", "add-storage-node", *where, "-s", "h:1", "-a", "2", "-g", "0")
    _assert_one_line_error(
        _run("zk", "add-storage-node", *where, "-s", "h:1", "-a", "2", "-g", "0"), "already exists"
    )
    _assert_one_line_error(
        _run("zk", "add-storage-node", *where, "-s", "h1", "-a", "2", "-g", "0"), "host:port"
    )
    _ok("zk", "assign-partition", *where, "-s", "h:1", "-p", "0-1")
    _assert_one_line_error(
        _run("zk", "assign-partition", *where, "-s", "h:1", "-p", "1"), "Partition 1 already exists"
    )
    _assert_one_line_error(
        _run("zk", "assign-partition", *where, "-s", "h:1", "-p", "3-5"),
        "[3, 5] does not belong to the cluster",
    )
    for bad in ("0-", "a", "2-1", ""):
        # A malformed list is a usage error (exit 2), caught by the parser.
        _assert_one_line_error(
            _run("zk", "assign-partition", *where, "-s", "h:1", "-p", bad), bad, exit_code=2
        )
    _assert_one_line_error(_run("zk", "delete", *where, "-n", "other"), "does not match")
    _assert_one_line_error(_run("zk", "auto-assign", *where, "-g", "7"), "No storage node found in group 7")


def test_unreachable_zookeeper_is_a_bounded_one_line_error() -> None:
    closed = f"127.0.0.1:{free_tcp_port()}"
    result = _run("zk", "list", "-z", closed, "-r", "/nowhere", "--connect-timeout-ms", "500")
    _assert_one_line_error(result, f"cannot connect to ZooKeeper at {closed}")


def test_missing_settings_name_the_key_and_file(tmp_path: Path) -> None:
    config = tmp_path / "tools.yml"
    config.write_text("zookeeper.connectString: 127.0.0.1:1\n")
    _assert_one_line_error(_run("zk", "list", "-c", str(config)), "cluster.root given: pass --cluster-root")
    _assert_one_line_error(_run("zk", "list", "-c", str(config)), str(config))
    _assert_one_line_error(_run("zk", "list", "-c", str(tmp_path / "none.yml")), "config file not found")
    _assert_one_line_error(_run("zk", "list", "-r", "/x"), "zookeeper.connectString")


def test_names_from_zookeeper_are_printed_literally(where: tuple[str, ...]) -> None:
    _ok("create-cluster", *where, "-n", "[bold]demo[/x]", "--partitions", "1")
    _ok("zk", "add-storage-node", *where, "-s", "[red]h:1", "-a", "2", "-g", "0")
    listed = _ok("zk", "list", *where).stdout
    assert "[bold]demo[/x]" in listed and "[red]h:1" in listed
    assert "deleted cluster [[bold]demo[/x]]" in _ok("zk", "delete", *where, "-n", "[bold]demo[/x]").stdout


def test_auto_assign_json_and_the_originals_spellings(where: tuple[str, ...]) -> None:
    _ok("create-cluster", *where, "-n", "demo", "--partitions", "4")
    # -p is a partition everywhere; the partition count is --partitions only.
    assert _run("create-cluster", *where, "-n", "demo", "-p", "4").exit_code == 2
    _ok("zk", "add-storage-node", *where, "-s", "h:1", "--storage-admin-port", "11", "-g", "0")  # hidden
    _ok("zk", "add-storage-node", *where, "-s", "h:2", "--admin-port", "12", "-g", "0")
    assigned = json.loads(_ok("zk", "auto-assign", *where, "-g", "0", "--json").stdout)
    assert assigned["group"] == 0
    nodes = {n["storage"]: n["partitions"] for n in assigned["nodes"]}
    assert sorted(nodes) == ["h:1", "h:2"] and all(len(p) == 2 for p in nodes.values())
    assert sorted(p for ps in nodes.values() for p in ps) == [0, 1, 2, 3]
    listed = json.loads(_ok("zk", "list", *where, "--json").stdout)
    connection = next(z for z in listed["znodes"] if z["path"].endswith("/store/connection"))
    assert sorted((e["storage_node_connect_string"], e["admin_port"]) for e in connection["decoded"]) == [
        ("h:1", 11),
        ("h:2", 12),
    ]
    assert all("num_children" in z and "numChildren" not in z for z in listed["znodes"])
