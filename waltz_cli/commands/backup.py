"""`waltz backup ...`: backups of a live cluster's committed log (our extension; the original
has none). A thin skin over :mod:`waltz_engine.ops.backup`; see docs/operations.md.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from waltz_cli import options
from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    cluster_command,
)
from waltz_cli.output import console, counting_progress, err_console, human_size, one_line_errors, print_json
from waltz_engine.net.tls import TlsConfig
from waltz_engine.ops.backup import (
    DEFAULT_SEGMENT_SIZE_BYTES,
    create_backup,
    describe_backup,
    issued_sessions,
    restore_backup,
    verify_backup,
)
from waltz_engine.ops.tool_config import load_tool_config
from waltz_engine.storage.constants import DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.zk.partition_ranges import parse_partition_ranges

if TYPE_CHECKING:
    from waltz_engine.zk.connection import ZooKeeperSettings

app = options.group(help="Backups of the committed log: create (incremental), verify, restore, list.")

MILLIS_PER_SECOND = 1000
BackupPartitionsOption = Annotated[
    str | None,
    typer.Option(
        "--partition", "--partitions", "-p", help="Partition ids and ranges, e.g. 0-3,7 (default all)."
    ),
]
UrlArgument = Annotated[
    str, typer.Argument(help="The backup: a local path, or s3://, gs://, hdfs://, file:// URL.")
]


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / MILLIS_PER_SECOND, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _client_tls(config: Path | None) -> TlsConfig:
    """The client's TLS settings (`ssl.*` of the client config), for the storage nodes' admin ports."""
    tool_config = load_tool_config(config)
    return TlsConfig.from_flat(tool_config.as_dict(), "client") if tool_config is not None else TlsConfig()


@app.command("create")
@one_line_errors
@cluster_command
def create(
    to: Annotated[str, typer.Option("--to", help="Where the backup goes: a local path or a URL.")],
    partitions: BackupPartitionsOption = None,
    segment_size_bytes: Annotated[
        int,
        typer.Option("--segment-size-bytes", min=1, help="The backup's segments roll over past this size."),
    ] = DEFAULT_SEGMENT_SIZE_BYTES,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Back up the committed log, or add to a backup what was committed since its last run.

    Reads the storage nodes over the network (their admin ports); the backup is a storage
    directory in the original's format plus a manifest, made visible only once complete.

    Example: waltz backup create -c client.yml --to s3://bucket/waltz-backup
    """
    wanted = parse_partition_ranges(partitions) if partitions is not None else None
    settings = cluster.settings()
    tls = _client_tls(cluster.config)
    with counting_progress("backing up (records)", as_json) as progress:
        summary = create_backup(
            ClusterAccess(settings, tls),
            to,
            wanted,
            segment_size_bytes=segment_size_bytes,
            progress=progress,
        )
    if as_json:
        print_json(summary.to_json())
        return
    if not summary.published:
        console.print(f"backup {summary.sequence} at {to} is up to date: nothing new was committed")
        return
    console.print(
        f"backup {summary.sequence} at {to}: {summary.records_added} record(s) added, "
        f"{summary.files_uploaded} file(s) ({summary.bytes_uploaded} bytes) uploaded "
        f"in {summary.seconds:.1f} s"
    )


@app.command("verify")
@one_line_errors
def verify(url: UrlArgument, as_json: JsonOption = False) -> None:
    """Check every file of a backup against its manifest and every record's checksums; exit 1 on damage.

    Example: waltz backup verify s3://bucket/waltz-backup
    """
    with counting_progress("verifying (files)", as_json) as progress:
        report = verify_backup(url, progress)
    if as_json:
        print_json(report.to_json())
    else:
        for problem in report.problems:
            console.print(problem, markup=False, soft_wrap=True)
        console.print(report.summary(), markup=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command("restore")
@one_line_errors
@cluster_command
def restore(
    url: UrlArgument,
    to: Annotated[Path, typer.Option("--to", help="A new (or empty) storage directory.")],
    to_txid: Annotated[
        int | None,
        typer.Option("--to-txid", help="Restore only transactions up to this one (each partition)."),
    ] = None,
    partitions: BackupPartitionsOption = None,
    all_replicas_lost: Annotated[
        bool,
        typer.Option(
            "--all-replicas-lost",
            help="Every replica was lost: the restored copies vote in the next recovery, and the "
            "log resumes at the backup's end (needs the cluster: -c/-z/-r). Stop the servers first.",
        ),
    ] = False,
    storage_config: Annotated[
        Path | None,
        typer.Option(
            "--storage-config",
            help="The YAML of the storage node that starts on the directory: its segments are "
            "written at its storage.segment.size.threshold, and its cluster's retention bounds apply.",
        ),
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Restore a backup into a storage directory a storage node starts on (ours or the original's).

    The records are written anew in the node's segment size (--storage-config; else the default
    threshold) with new indexes, each record checked (both checksums) as it is read. No record
    below a partition's retention bound is restored: the bounds are read from the cluster that
    --storage-config or -c/-z names (without either, the node's cleaner removes whole segments
    below them when it starts). Then point the node's storage.directory at it and start the node;
    the server's next store session catches it up from the other replicas (docs/operations.md).
    When no replica is left to catch up from, restore every node with --all-replicas-lost
    (docs/operations.md §5).

    Example: waltz backup restore s3://bucket/backup --to /var/lib/waltz/storage --storage-config storage.yml
    """
    wanted = parse_partition_ranges(partitions) if partitions is not None else None
    session_ids = None
    if all_replicas_lost:
        settings = cluster.settings()
        session_ids = issued_sessions(url, settings, _client_tls(cluster.config))
    segment_size_bytes, bounds_from = _restore_target(storage_config, cluster)
    with counting_progress("restoring (files)", as_json) as progress:
        summary = restore_backup(
            url,
            to,
            to_txid=to_txid,
            partitions=wanted,
            session_ids=session_ids,
            progress=progress,
            segment_size_bytes=segment_size_bytes,
            retention_from=bounds_from,
        )
    if as_json:
        print_json(summary.to_json())
        return
    if bounds_from is None:
        err_console.print(
            "note: retention bounds not read (no --storage-config or -c/-z): the node's cleaner "
            "removes whole segments below them when it starts",
            soft_wrap=True,
            markup=False,
        )
    for p, span in sorted(summary.partitions.items()):
        first, last = span["first_txid"], span["last_txid"]
        held = f"transactions {first}..{last}" if last >= first else "no transactions (empty partition)"
        console.print(f"partition {p}: {held}")
    console.print(
        f"restored backup {summary.sequence} into {to}: {summary.files} file(s), "
        f"{human_size(summary.bytes)}, written in segments of {human_size(segment_size_bytes)}"
    )


def _restore_target(storage_config: Path | None, cluster: Cluster) -> tuple[int, ZooKeeperSettings | None]:
    """The node's segment size, and where to read the retention bounds (None: nowhere named)."""
    if storage_config is not None:
        from waltz_engine.storage.node.config import StorageConfig

        node = StorageConfig.load(storage_config)
        return node.segment_size_threshold_bytes, node.zookeeper
    named = cluster.config is not None or cluster.zookeeper is not None
    return DEFAULT_SEGMENT_SIZE_THRESHOLD_BYTES, cluster.settings() if named else None


@app.command("list")
@one_line_errors
def list_(url: UrlArgument, as_json: JsonOption = False) -> None:
    """What a backup holds: its newest complete run, per partition the transactions and files.

    Example: waltz backup list /backups/waltz --json
    """
    described = describe_backup(url)
    if as_json:
        print_json(described)
        return
    table = Table("partition", "first txid", "last txid", "records", "segments", "size")
    for p in described["partitions"]:
        table.add_row(
            str(p["partition"]),
            str(p["first_txid"]),
            str(p["last_txid"]),
            str(p["records"]),
            str(p["segments"]),
            human_size(p["bytes"]),
        )
    table.caption = (
        f"backup {described['sequence']} of cluster {described['cluster_key']} "
        f"({described['cluster_root']}), "
        f"made {_when(described['created_ms'])}; {described['runs']} run(s), {human_size(described['bytes'])}"
    )
    console.print(table)
