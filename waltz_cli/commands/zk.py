"""`waltz zk ...` and `waltz create-cluster`: the embedded ZooKeeper and cluster metadata.

A thin skin over :mod:`waltz_engine.zk`: every command resolves where ZooKeeper is
(``--zookeeper``/``--cluster-root`` or ``--config`` with the original's YAML keys), calls one
library function, and renders the result as text or JSON. Subcommands and options follow the
original ``ZooKeeperCli`` (reference §4.1).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, NoReturn

import typer
from kazoo.client import KazooClient
from rich.table import Table
from rich.text import Text

from waltz_cli import options
from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    PartitionsOption,
    cluster_command,
)
from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import ClusterSnapshot, delete_cluster, read_snapshot
from waltz_engine.zk.cluster import create_cluster as create_cluster_znodes
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.partition_ranges import format_partition_ranges, parse_partition_ranges
from waltz_engine.zk.server import (
    DEFAULT_ADDRESS,
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    START_TIMEOUT_MS,
    EmbeddedZooKeeper,
    find_data_dir,
)
from waltz_engine.zk.znode_dump import dump_znodes, snake_case_keys
from waltz_engine.zk.znodes import ClusterMetadataError

app = options.group(help="Run an embedded ZooKeeper and manage cluster metadata in it.")

EXIT_NOT_RUNNING = 3  # LSB convention for "status: program is not running"
MISSING = "-"

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        "-d",
        help="Where the embedded ZooKeeper keeps its config, pid, log and data "
        f"(default: {DEFAULT_DATA_DIR}, or a dev cluster's .waltz-dev/zookeeper).",
    ),
]
StorageOption = Annotated[
    str, typer.Option("--storage", "-s", help="A storage node's data address HOST:PORT, as registered.")
]


@contextmanager
def _cluster(
    cluster: Cluster,
) -> Iterator[tuple[KazooClient, ZooKeeperSettings]]:
    settings = cluster.settings()
    with connect(settings) as client:
        yield client, settings


# --- embedded ZooKeeper ----------------------------------------------------------------------


@app.command("start")
@one_line_errors
def start(
    port: Annotated[int, typer.Option("--port", help="Client port.")] = DEFAULT_PORT,
    data_dir: DataDirOption = None,
    address: Annotated[str, typer.Option("--address", help="Address to listen on.")] = DEFAULT_ADDRESS,
    daemon: Annotated[
        bool, typer.Option("--daemon", help="Run in the background; return once it answers.")
    ] = False,
    wait_timeout_ms: Annotated[
        int, typer.Option("--timeout-ms", min=1, help="How long to wait for it to answer.")
    ] = START_TIMEOUT_MS,
) -> None:
    """Start a standalone ZooKeeper (needs Java 17; jars from pyspark, else from libzookeeper-java).

    Runs in the foreground until Ctrl-C unless --daemon is given; keeps its state in --dir
    (default .waltz/zookeeper).

    Example: waltz zk start --port 2181 --dir /tmp/zk --daemon
    """
    server = EmbeddedZooKeeper(data_dir or DEFAULT_DATA_DIR, port, address)
    pid = server.start(wait_timeout_ms)
    where = (
        f"ZooKeeper {server.connect_string} (pid {pid}, data dir {server.data_dir}, log {server.log_file})"
    )
    if daemon:
        _say(f"started {where}")
        return
    _say(f"running {where}; press Ctrl-C to stop")

    def interrupt(_signum: int, _frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)  # `kill` of this process stops ZooKeeper too
    try:
        code = server.wait()
        raise typer.Exit(0 if code in (0, -signal.SIGTERM, 128 + signal.SIGTERM) else 1)
    except KeyboardInterrupt:
        server.stop()
        _say("stopped")
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command("stop")
@one_line_errors
def stop(data_dir: DataDirOption = None) -> None:
    """Stop the embedded ZooKeeper of --dir (default: .waltz/zookeeper, or the dev cluster's).

    Example: waltz zk stop --dir /tmp/zk
    """
    server = EmbeddedZooKeeper(data_dir or find_data_dir())
    if server.stop():
        _say(f"stopped ZooKeeper {server.connect_string} ({server.data_dir})")
    else:
        _say(f"ZooKeeper is not running from {server.data_dir}")


@app.command("status")
@one_line_errors
def status(data_dir: DataDirOption = None, as_json: JsonOption = False) -> None:
    """Say whether the embedded ZooKeeper of --dir runs, and where; exits 3 when it does not.

    Without --dir: .waltz/zookeeper (`waltz zk start`), or the dev cluster's .waltz-dev/zookeeper.

    Example: waltz zk status --dir /tmp/zk
    """
    state = EmbeddedZooKeeper(data_dir or find_data_dir()).status()
    if as_json:
        print_json(state.to_json())
    elif state.running:
        details = ", ".join(x for x in (state.mode, state.version and f"version {state.version}") if x)
        _say(
            f"running: ZooKeeper at {state.connect_string} (pid {state.pid}{', ' if details else ''}"
            f"{details}; data dir {state.data_dir})"
        )
    else:
        _say(f"not running: no ZooKeeper runs from {state.data_dir}")
    if not state.running:
        raise typer.Exit(EXIT_NOT_RUNNING)


# --- cluster metadata ------------------------------------------------------------------------


@one_line_errors
@cluster_command
def create_cluster(
    name: Annotated[str, typer.Option("--name", "-n", help="Name of the Waltz cluster.")],
    partitions: Annotated[int, typer.Option("--partitions", help="Number of partitions (a count).")],
    cluster_key: Annotated[
        str | None,
        typer.Option(
            "--cluster-key",
            help="Use this key, not a new random one: to rebuild a cluster whose storage directories "
            "or backups have it (`waltz backup list` shows a backup's).",
        ),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Create a new Waltz cluster in ZooKeeper (the original's `ZooKeeperCli create`).

    Refuses if anything exists at the cluster root. Writes the cluster parameters, id counters,
    and store parameters with a new random cluster key (or --cluster-key).

    Example: waltz create-cluster -z 127.0.0.1:2181 -r /waltz --name demo --partitions 4
    """
    key = _parse_key(cluster_key) if cluster_key is not None else None
    with _cluster(cluster) as (client, settings):
        params = create_cluster_znodes(client, settings.cluster_root, name, partitions, key)
    if as_json:
        print_json(
            {
                "cluster_root": settings.cluster_root,
                "name": name,
                "num_partitions": partitions,
                "key": str(params.key),
            }
        )
        return
    _say(f"created cluster {name} with {partitions} partitions at {settings.cluster_root}")
    _say(f"cluster key: {params.key}")


def _parse_key(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ClusterMetadataError(
            f"--cluster-key '{text}' is not a cluster key: give a UUID such as {uuid.UUID(int=0)}"
        ) from None


@app.command("delete")
@one_line_errors
@cluster_command
def delete(
    name: Annotated[str, typer.Option("--name", "-n", help="Name of the cluster, as a safety check.")],
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Delete even if the names do not match.")
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Delete all metadata of a cluster (recursively), if its stored name is --name.

    Example: waltz zk delete -z 127.0.0.1:2181 -r /waltz --name demo
    """
    with _cluster(cluster) as (client, settings):
        delete_cluster(client, settings.cluster_root, name, force)
    _say(f"deleted cluster [{name}] at {settings.cluster_root}")


@app.command("list")
@one_line_errors
@cluster_command
def list_(
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Show the cluster's metadata: servers, assignments, store, storage nodes, replica states.

    With --json, every znode under the root is printed raw (hex) and decoded.

    Example: waltz zk list -z 127.0.0.1:2181 -r /waltz
    """
    with _cluster(cluster) as (client, settings):
        if as_json:
            records = dump_znodes(client, settings.cluster_root)
        else:
            snapshot = read_snapshot(client, settings.cluster_root)
    if as_json:
        znodes = [snake_case_keys(r.to_json()) for r in records]
        print_json({"cluster_root": settings.cluster_root, "znodes": znodes})
    else:
        _render_snapshot(snapshot)


@app.command("show-cluster-key")
@one_line_errors
@cluster_command
def show_cluster_key(
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Print the cluster key (the UUID every storage file of this cluster carries).

    Example: waltz zk show-cluster-key -z 127.0.0.1:2181 -r /waltz
    """
    with _cluster(cluster) as (client, settings):
        params = store_metadata.read_store_params(client, settings.cluster_root)
    if as_json:
        print_json({"key": str(params.key), "num_partitions": params.num_partitions})
    else:
        _say(str(params.key))


@app.command("add-storage-node")
@one_line_errors
@cluster_command
def add_storage_node(
    storage: StorageOption,
    admin_port: Annotated[
        int, typer.Option("--admin-port", "-a", help="Admin port of the storage node (storage.admin.port).")
    ],
    group: Annotated[int, typer.Option("--group", "-g", help="Storage group to add it to.")],
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Add a storage node to a group (with no partitions yet).

    Example: waltz zk add-storage-node -c tools.yml -s localhost:57280 -a 57281 -g 0
    """
    with _cluster(cluster) as (client, settings):
        store_metadata.add_storage_node(client, settings.cluster_root, storage, group, admin_port)
    _say(f"added storage node {storage} (admin port {admin_port}) to group {group}")


@app.command("remove-storage-node")
@one_line_errors
@cluster_command
def remove_storage_node(
    storage: StorageOption,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Remove a storage node from the cluster (it must hold no partitions).

    Example: waltz zk remove-storage-node -c tools.yml -s localhost:57280
    """
    with _cluster(cluster) as (client, settings):
        store_metadata.remove_storage_node(client, settings.cluster_root, storage)
    _say(f"removed storage node {storage}")


@app.command("assign-partition")
@one_line_errors
@cluster_command
def assign_partition(
    storage: StorageOption,
    partition: PartitionsOption,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Assign partitions to a storage node.

    Example: waltz zk assign-partition -c tools.yml -s localhost:57280 -p 0-3
    """
    partitions = parse_partition_ranges(partition)
    with _cluster(cluster) as (client, settings):
        store_metadata.assign_partitions(client, settings.cluster_root, storage, partitions)
    _say(f"assigned partitions {format_partition_ranges(partitions)} to {storage}")


@app.command("unassign-partition")
@one_line_errors
@cluster_command
def unassign_partition(
    storage: StorageOption,
    partition: PartitionsOption,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Un-assign partitions from a storage node (its group must keep another copy of each).

    Example: waltz zk unassign-partition -c tools.yml -s localhost:57280 -p 2-3
    """
    partitions = parse_partition_ranges(partition)
    with _cluster(cluster) as (client, settings):
        store_metadata.unassign_partitions(client, settings.cluster_root, storage, partitions)
    _say(f"un-assigned partitions {format_partition_ranges(partitions)} from {storage}")


@app.command("auto-assign")
@one_line_errors
@cluster_command
def auto_assign(
    group: Annotated[
        int, typer.Option("--group", "-g", help="Storage group whose nodes get the partitions.")
    ],
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Spread all partitions round-robin over the storage nodes of a group (none may hold any yet).

    Prints each node of the group with the partitions it now holds.

    Example: waltz zk auto-assign -c tools.yml -g 0
    """
    with _cluster(cluster) as (client, settings):
        store_metadata.auto_assign(client, settings.cluster_root, group)
        assignments = store_metadata.read_replica_assignments(client, settings.cluster_root)
        groups = store_metadata.read_group_descriptor(client, settings.cluster_root).as_dict()
    nodes = [(s, list(p)) for s, p in sorted(assignments.replicas) if groups.get(s) == group]
    if as_json:
        print_json({"group": group, "nodes": [{"storage": s, "partitions": p} for s, p in nodes]})
        return
    for storage, partitions in nodes:
        _say(f"{storage}: {format_partition_ranges(partitions) or 'no partitions'}")


# --- rendering -------------------------------------------------------------------------------


def _render_snapshot(snapshot: ClusterSnapshot) -> None:
    _say(f"cluster {snapshot.cluster.name} at {snapshot.root}: {snapshot.cluster.num_partitions} partitions")

    servers = Table(title="servers", title_justify="left")
    for column in ("server", "endpoint", "preferred partitions"):
        servers.add_column(column)
    for server in snapshot.servers:
        preferred = format_partition_ranges(server.preferred_partitions) or "any"
        _row(servers, str(server.server_id), server.endpoint, preferred)
    _print_table(servers, "no servers registered")

    assignment = snapshot.assignment
    title = "partition assignment"
    if assignment is not None:
        title += (
            f" (cversion {assignment.cversion}, {assignment.num_endpoints} endpoints, "
            f"{assignment.num_partitions} partitions)"
        )
    owners = Table(title=title, title_justify="left")
    for column in ("server", "partition", "generation"):
        owners.add_column(column, justify="right")
    rows = sorted(
        (server.server_id, info.partition_id, info.generation)
        for server in (assignment.servers if assignment is not None else ())
        for info in server.partitions
    )
    for row in rows:
        _row(owners, *(str(value) for value in row))
    _print_table(owners, "no partitions assigned to servers" if assignment is not None else "not found")

    store = snapshot.store
    if store is None:
        _say("store parameters: not found")
    else:
        _say(f"store: key {store.key}, {store.num_partitions} partitions")

    groups = snapshot.groups.as_dict() if snapshot.groups is not None else {}
    replicas = snapshot.replicas.as_dict() if snapshot.replicas is not None else {}
    ports = snapshot.connections.as_dict() if snapshot.connections is not None else {}
    nodes = Table(title="storage nodes", title_justify="left")
    for column in ("storage", "group", "admin port", "partitions"):
        nodes.add_column(column)
    for storage in sorted(set(groups) | set(replicas) | set(ports)):
        partitions = replicas.get(storage)
        _row(
            nodes,
            storage,
            str(groups.get(storage, MISSING)),
            str(ports.get(storage, MISSING)),
            MISSING if partitions is None else format_partition_ranges(partitions) or "none",
        )
    _print_table(nodes, "no storage nodes")

    states = Table(title="replica states", title_justify="left")
    for column in ("partition", "generation", "session", "replica", "replica session", "closing HWM"):
        states.add_column(column)
    for partition_id, metadata in snapshot.partitions:
        if metadata is None:
            _row(states, str(partition_id), MISSING, MISSING, "no znode", MISSING, MISSING)
            continue
        ordered = sorted(metadata.replica_states, key=lambda s: s.replica_id.storage)
        if not ordered:
            _row(
                states, str(partition_id), str(metadata.generation), str(metadata.session_id), "none", "", ""
            )
        for state in ordered:
            _row(
                states,
                str(partition_id),
                str(metadata.generation),
                str(metadata.session_id),
                state.replica_id.storage,
                str(state.session_id),
                "UNRESOLVED" if state.is_unresolved else str(state.closing_high_water_mark),
            )
    _print_table(states, "no partitions")


def _print_table(table: Table, empty_message: str) -> None:
    if table.row_count:
        console.print(table)
    else:
        _say(f"{table.title}: {empty_message}")


def _say(message: str) -> None:
    """One message, one line: never wrapped, and names from ZooKeeper are never read as markup."""
    console.print(message, soft_wrap=True, markup=False)


def _row(table: Table, *values: str) -> None:
    table.add_row(*(Text(value) for value in values))
