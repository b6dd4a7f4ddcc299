"""`waltz storage list | add-partition | ...`: admin commands against running storage nodes.

A thin skin over :mod:`waltz_engine.storage.admin_ops`: each command reads the cluster's
store metadata from ZooKeeper (``-c/-z/-r`` as every cluster command), calls one library
function and renders the result as text or JSON. Subcommands and checks follow the original
``StorageCli`` (reference §4.2); ``-s/--storage`` takes a node's data address as registered
(its admin port is read from store/connection) or, as the original, its admin address.
``checksum`` is our addition (the original's replica check, ``WaltzStorage.checksums``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    PartitionOption,
    PartitionsOption,
    SslConfigOption,
    StorageOption,
    cluster_command,
)
from waltz_cli.output import console, err_console, fail, one_line_errors, print_json
from waltz_engine.storage import admin_ops
from waltz_engine.storage.admin_ops import (
    NodePartitions,
    RecoveryProgress,
    StorageContext,
    StorageNode,
    StoreLayout,
)
from waltz_engine.zk.connection import connect
from waltz_engine.zk.partition_ranges import format_partition_ranges, parse_partition_ranges

T = TypeVar("T")

StoragePortOption = Annotated[
    int | None,
    typer.Option(
        "--storage-port",
        help="The node's data port (default: the one registered in ZooKeeper for --storage).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add the admin commands to the `waltz storage` group."""
    for name, command in (
        ("list", list_),
        ("add-partition", add_partition),
        ("remove-partition", remove_partition),
        ("availability", availability),
        ("recover-partition", recover_partition),
        ("sync-partitions", sync_partitions),
        ("validate", validate),
        ("max-transaction-id", max_transaction_id),
        ("checksum", checksum),
    ):
        app.command(name)(command)


# --- plumbing -------------------------------------------------------------------------------


def _read_layout(cluster: Cluster) -> StoreLayout:
    settings = cluster.settings()
    with connect(settings) as client:
        return admin_ops.read_store_layout(client, settings.cluster_root)


@contextmanager
def _storage(cluster: Cluster, ssl_config: Path | None) -> Iterator[tuple[StorageContext, StoreLayout]]:
    layout = _read_layout(cluster)
    yield layout.context(cluster.tls_context(ssl_config), cluster.timeout_ms), layout


@contextmanager
def storage_node(
    storage: str, cluster: Cluster, ssl_config: Path | None
) -> Iterator[tuple[StorageContext, StorageNode]]:
    """The admin context and the node ``storage`` names (its data or admin address); a
    malformed address fails before ZooKeeper is asked."""
    admin_ops.parse_storage_address(storage)
    with _storage(cluster, ssl_config) as (ctx, layout):
        yield ctx, layout.resolve_node(storage)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def _say(message: str) -> None:
    """One line, never wrapped; host names are never read as markup."""
    console.print(message, soft_wrap=True, markup=False)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(value) for value in row))
    return table


def _name(node: StorageNode) -> str:
    """A node as the output names it: its data address and admin port, or its admin address."""
    if node.storage is None:
        return str(node.admin)
    return f"{node.storage} (admin port {node.admin.port})"


# --- list -----------------------------------------------------------------------------------


@one_line_errors
@cluster_command
def list_(
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            "-s",
            help="Only this node, HOST:PORT (its data port as registered, or its admin port); "
            "default: every node.",
        ),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """List partition ownership data of storage nodes (session, watermarks, assigned, available, damaged,
    local and tier segments and bytes).

    Without --storage, every node registered in ZooKeeper (store/connection) is asked.

    Example: waltz storage list -c tools.yml -s localhost:55280
    """
    if storage is not None:
        admin_ops.parse_storage_address(storage)
    with _storage(cluster, ssl_config) as (
        ctx,
        layout,
    ):
        if storage is not None:
            node = layout.resolve_node(storage)
            nodes = [_run(admin_ops.list_partitions(ctx, node.admin, node.storage))]
        else:
            nodes = _run(admin_ops.list_all_partitions(ctx, layout))
    if as_json:
        print_json({"nodes": [node.to_json() for node in nodes]})
        return
    if not nodes:
        _say("no storage nodes registered in ZooKeeper")
    for found in nodes:
        _render_node(found)


def _render_node(node: NodePartitions) -> None:
    name = str(node.address) if node.storage is None else f"{node.storage} (admin {node.address})"
    if not node.partitions:
        _say(f"{name}: no partitions")
        return
    rows = [
        (
            str(p.partition_id),
            str(p.session_id),
            str(p.low_water_mark),
            str(p.local_low_water_mark),
            "yes" if p.is_assigned else "no",
            "yes" if p.is_available else "no",
            p.describe_damage(),
            *p.describe_usage(),
        )
        for p in node.partitions
    ]
    columns = (
        "partition",
        "session",
        "low-water mark",
        "local low-water mark",
        "assigned",
        "available",
        "damaged",
        "local",
        "tier",
    )
    console.print(_table(f"partitions at {name}", columns, rows))


# --- assignment and availability ------------------------------------------------------------


@one_line_errors
@cluster_command
def add_partition(
    storage: StorageOption,
    partition: PartitionsOption,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
) -> None:
    """Add a partition ownership to a storage node (creates its directory and first segment).

    Example: waltz storage add-partition -c tools.yml -s localhost:55280 -p 0-3
    """
    ids = parse_partition_ranges(partition)
    with storage_node(storage, cluster, ssl_config) as (
        ctx,
        node,
    ):
        ids = _run(admin_ops.add_partitions(ctx, node.admin, ids))
    _say(f"added partitions {format_partition_ranges(ids)} to {_name(node)}")


@one_line_errors
@cluster_command
def remove_partition(
    storage: StorageOption,
    partition: PartitionsOption,
    delete_storage_files: Annotated[
        bool, typer.Option("--delete-storage-files", help="Also delete the partitions' segment files.")
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
) -> None:
    """Remove a partition ownership from a storage node; its files are kept unless
    --delete-storage-files is given.

    Example: waltz storage remove-partition -c tools.yml -s localhost:55280 -p 3 --delete-storage-files
    """
    ids = parse_partition_ranges(partition)
    with storage_node(storage, cluster, ssl_config) as (
        ctx,
        node,
    ):
        ids = _run(
            admin_ops.remove_partitions(ctx, node.admin, ids, delete_storage_files=delete_storage_files)
        )
    files = "deleted" if delete_storage_files else "kept"
    _say(f"removed partitions {format_partition_ranges(ids)} from {_name(node)} (segment files {files})")


@one_line_errors
@cluster_command
def availability(
    storage: StorageOption,
    partition: PartitionsOption,
    online: Annotated[
        bool | None,
        typer.Option(
            "--online/--offline",
            help="--online: the partitions serve reads and writes; --offline: they refuse them.",
            show_default=False,
        ),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
) -> None:
    """Set the read/write availability of partitions in a storage node (--online or --offline).

    Example: waltz storage availability -c tools.yml -s localhost:55280 -p 0 --offline
    """
    if online is None:
        fail("give --online or --offline")
    ids = parse_partition_ranges(partition)
    with storage_node(storage, cluster, ssl_config) as (
        ctx,
        node,
    ):
        ids = _run(admin_ops.set_availability(ctx, node.admin, ids, online=online))
    state = "online" if online else "offline"
    _say(f"partitions {format_partition_ranges(ids)} at {_name(node)} are now {state}")


@one_line_errors
@cluster_command
def sync_partitions(
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Sync partition ownership to storage nodes based on the assignment in ZooKeeper.

    Assigns what ZooKeeper assigns a node (unless assigned and available there already) and
    un-assigns, keeping the files, what the node holds beyond that.

    Example: waltz storage sync-partitions -c tools.yml
    """
    with _storage(cluster, ssl_config) as (
        ctx,
        layout,
    ):
        results = _run(admin_ops.sync_partitions(ctx, layout))
    if as_json:
        print_json({"nodes": [r.to_json() for r in results]})
        return
    if not results:
        _say("no storage nodes in the ZooKeeper assignment")
    for r in results:
        assigned = format_partition_ranges(r.assigned) or "none"
        unassigned = format_partition_ranges(r.unassigned) or "none"
        _say(f"{r.storage} (admin {r.address}): assigned {assigned}, un-assigned {unassigned}")


@one_line_errors
@cluster_command
def validate(
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate Waltz storage node connectivity: open every node's data and admin port.

    Exits 1 naming the first endpoint that failed.

    Example: waltz storage validate -c tools.yml
    """
    with _storage(cluster, ssl_config) as (
        ctx,
        layout,
    ):
        checks = _run(admin_ops.validate(ctx, layout))
    if as_json:
        print_json({"ok": all(c.ok for c in checks), "endpoints": [c.to_json() for c in checks]})
    elif checks:
        rows = [(c.storage, c.port_kind, str(c.address), "ok" if c.ok else "FAILED") for c in checks]
        console.print(_table("storage node connectivity", ("storage", "port", "address", "result"), rows))
    else:
        _say("no storage nodes registered in ZooKeeper")
    failed = [c for c in checks if c.error is not None]
    if failed:
        fail(f"{len(failed)} of {len(checks)} endpoints failed; {failed[0].error}")


# --- max transaction id -----------------------------------------------------------------------


@one_line_errors
@cluster_command
def max_transaction_id(
    storage: StorageOption,
    partition: PartitionOption,
    storage_port: StoragePortOption = None,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Ask in offline-recovery mode (the partition must be unavailable)."),
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Display the max transaction ID of a partition on a storage node.

    Example: waltz storage max-transaction-id -c tools.yml -s localhost:55280 -p 0
    """
    with storage_node(storage, cluster, ssl_config) as (
        ctx,
        node,
    ):
        data_port = node.data_port(storage_port)
        txid = _run(admin_ops.max_transaction_id(ctx, node.admin, data_port, partition, offline=offline))
    if as_json:
        print_json(
            {
                "storage": node.storage,
                "admin": str(node.admin),
                "partition_id": partition,
                "max_transaction_id": txid,
            }
        )
    else:
        _say(f"Max Transaction ID: {txid}")


# --- recovery ----------------------------------------------------------------------------------


@one_line_errors
@cluster_command
def recover_partition(
    source_storage: Annotated[
        str,
        typer.Option(
            "--storage",
            "-s",
            help="The node to copy from, HOST:PORT (its data port as registered, or its admin port).",
        ),
    ],
    destination_storage: Annotated[
        str,
        typer.Option(
            "--destination-storage",
            help="The node to copy to, HOST:PORT (its data port as registered, or its admin port).",
        ),
    ],
    partition: PartitionOption,
    destination_storage_port: Annotated[
        int | None,
        typer.Option(
            "--destination-storage-port",
            help="Data port of the destination (default: the one registered in ZooKeeper).",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", "-b", help="Records per RECORD_LIST request.")
    ] = admin_ops.DEFAULT_RECOVERY_BATCH_SIZE,
    source_ssl_config: Annotated[
        Path | None,
        typer.Option("--source-ssl-config", help="server.ssl.* YAML for the source node."),
    ] = None,
    destination_ssl_config: Annotated[
        Path | None,
        typer.Option("--destination-ssl-config", help="server.ssl.* YAML for the destination node."),
    ] = None,
    refill_only: Annotated[
        bool,
        typer.Option(
            "--refill-only",
            help="Only refill the destination's damaged segments from the source; cut and copy nothing.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Cut the destination to its low-water mark even where the source cannot copy back "
            "what the cut removes (the original tool's behaviour).",
        ),
    ] = False,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Copy records of a partition from one storage node (-s) to another (--destination-storage).

    The partition must be unavailable on the destination (`availability --offline`). The
    destination is truncated to its low-water mark, its damaged segments (see `storage list`)
    are refilled from the source, then records are copied from the source up to the source's
    local low-water mark (fixed at the start: re-run to catch up further).

    A destination holding records above its low-water mark that the source does not hold is
    refused: they may be committed copies a quorum needs. --refill-only repairs rot without a
    cut; --force cuts anyway.

    Example: waltz storage recover-partition -s host1:55280 --destination-storage host2:55280 -p 0
    """
    admin_ops.parse_storage_address(source_storage)
    admin_ops.parse_storage_address(destination_storage)
    admin_ops.check_batch_size(batch_size)
    source_ssl = cluster.tls_context(source_ssl_config or ssl_config)
    destination_ssl = cluster.tls_context(destination_ssl_config or ssl_config)
    layout = _read_layout(cluster)
    source = layout.resolve_node(source_storage)
    destination = layout.resolve_node(destination_storage)
    data_port = destination.data_port(destination_storage_port)
    ctx = layout.context(source_ssl, cluster.timeout_ms)
    with _recovery_progress(partition) as progress:
        result = _run(
            admin_ops.recover_partition(
                ctx,
                source.admin,
                destination.admin,
                data_port,
                partition,
                batch_size=batch_size,
                source_ssl_context=source_ssl,
                destination_ssl_context=destination_ssl,
                progress=progress,
                refill_only=refill_only,
                cut_above_source=force,
            )
        )
    if as_json:
        print_json(result.to_json())
        return
    _say(
        f"partition {partition}: {_name(destination)} now holds transactions up to {result.final} "
        f"(copied {result.records_copied} records from {_name(source)}, target {result.target})"
        + (
            f"; refilled {result.records_refilled} records of damaged segments"
            if result.records_refilled
            else ""
        )
    )


@contextmanager
def _recovery_progress(partition_id: int) -> Iterator[Callable[[RecoveryProgress], None]]:
    """A progress bar on a terminal; otherwise a line every RECOVERY_LOG_INTERVAL_TXNS (stderr)."""
    if not err_console.is_terminal:
        last_logged = [-1]

        def log_line(p: RecoveryProgress) -> None:
            bucket = p.current // admin_ops.RECOVERY_LOG_INTERVAL_TXNS
            if bucket != last_logged[0] or p.current >= p.target:
                last_logged[0] = bucket
                err_console.print(
                    f"partition {partition_id}: destination at {p.current} of {p.target} ({p.fraction:.2%})",
                    soft_wrap=True,
                    markup=False,
                )

        yield log_line
        return
    with Progress(
        TextColumn(f"partition {partition_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("recover", total=None)

        def update(p: RecoveryProgress) -> None:
            bar.update(task, total=max(p.target - p.start, 0), completed=p.current - p.start)

        yield update


# --- checksum (our addition) -------------------------------------------------------------------


@one_line_errors
@cluster_command
def checksum(
    directory: Annotated[
        Path | None,
        typer.Argument(help="Storage directory of a stopped node (storage.directory); not with --online."),
    ] = None,
    partition: Annotated[
        str | None,
        typer.Option("--partition", "-p", help="Partition ids and ranges (default: every assigned one)."),
    ] = None,
    online: Annotated[
        bool, typer.Option("--online", help="Compare the replicas on running nodes (see above).")
    ] = False,
    from_txid: Annotated[int, typer.Option("--from", min=0, help="With --online: the first txid.")] = 0,
    to_txid: Annotated[
        int | None,
        typer.Option("--to", min=0, help="With --online: the last txid (default: the committed mark now)."),
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="First do what the node's start does (cut a torn tail, rebuild the index, remove "
            "interrupted files), in every assigned partition; list what changed.",
        ),
    ] = False,
    ssl_config: SslConfigOption = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Per partition, CRC-32 over all segment bytes after the headers: equal on equal replicas.

    The node must be stopped (its control file is locked while it runs). A check: nothing in the
    directory is written; damage (a torn tail, an index that differs from the records, interrupted
    or missing files, rot) exits 1 naming it. --repair first repairs what the node's start would
    (rot stays: refill it with recover-partition). With --online, every
    replica of a committed range is read from the running nodes' admin ports (RECORD_LIST: Java
    nodes too) in chunks while writes go on, and compared by records; exit 1 when replicas differ
    (naming the first txid that differs) or one is behind.

    Example: waltz storage checksum /var/lib/waltz-storage -c tools.yml -p 0-3
    Example: waltz storage checksum --online -p 2 --from 1000 --to 50000
    """
    ids = parse_partition_ranges(partition) if partition is not None else None
    if online:
        if directory is not None or repair:
            fail("--online reads the running nodes: give no storage directory and no --repair")
        _online_checksum(ids, from_txid, to_txid, cluster, ssl_config, as_json)
        return
    if directory is None:
        fail("give the storage directory of a stopped node, or --online for running nodes")
    layout = _read_layout(cluster)
    if ids is not None:
        admin_ops.check_partitions(ids, layout.num_partitions)
    result = admin_ops.replica_checksums(directory, layout.key, layout.num_partitions, ids, repair=repair)
    sums = result.checksums
    if as_json:
        checksums = [{"partition_id": p, "checksum": c} for p, c in sums.items()]
        print_json(
            {"checksums": checksums, "repaired": result.repaired} if repair else {"checksums": checksums}
        )
        return
    for line in result.repaired:
        _say(f"repaired: {line}")
    if not sums:
        _say(f"no partitions assigned in {directory}")
        return
    rows = [(str(p), str(c), f"{c & 0xFFFFFFFF:08x}") for p, c in sums.items()]
    console.print(_table(f"segment checksums of {directory}", ("partition", "crc32", "hex"), rows))


def _online_checksum(
    ids: list[int] | None,
    from_txid: int,
    to_txid: int | None,
    cluster: Cluster,
    ssl_config: Path | None,
    as_json: bool,
) -> None:
    from waltz_engine.ops.online_checksum import compare_partitions
    from waltz_engine.storage.network_reader import ClusterAccess

    access = ClusterAccess(cluster.settings(), cluster.tls_config(ssl_config))
    results = compare_partitions(access, ids, from_txid, to_txid)
    if as_json:
        print_json({"partitions": [r.to_json() for r in results]})
    else:
        rows = [row for r in results for row in r.rows()]
        columns = ("partition", "txids", "replica", "crc32", "result")
        console.print(_table("replicas compared online", columns, rows))
    if not all(r.consistent for r in results):
        raise typer.Exit(1)
