"""`waltz bench ...`: benchmarks (never tests) of the engine, nodes and clients."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from waltz_cli import options
from waltz_cli.options import (
    ENV_CLUSTER_ROOT,
    ENV_CONFIG,
    ENV_ZOOKEEPER,
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    SslConfigOption,
    cluster_command,
)
from waltz_cli.output import console, err_console, fail, one_line_errors, print_json
from waltz_engine.bench import crc_bench, engine_bench, floor
from waltz_engine.common.address import parse_host_port

if TYPE_CHECKING:
    pass

app = options.group(help="Benchmarks: measure throughput and latency on this machine.")


def _cpu_model() -> str:
    """The first CPU's model name (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine() -> dict[str, object]:
    # The load averages at the report, i.e. over the last 1, 5 and 15 minutes of the run: on a
    # shared machine they say how far its figures can be trusted.
    load = [round(value, 2) for value in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average": load,
        "platform": platform.platform(),
    }


@app.command("engine")
@one_line_errors
def engine(
    directory: Annotated[
        Path,
        typer.Option(
            "--dir", "-d", help="Directory on the disk to measure (a scratch sub-directory is used)."
        ),
    ] = Path("."),
    seconds: Annotated[
        float | None,
        typer.Option("--duration-s", min=0.1, help="Run each engine loop this many seconds (default 3)."),
    ] = None,
    records: Annotated[
        int | None, typer.Option("--records", min=1, help="Append this many records per batch size instead.")
    ] = None,
    batch_sizes: Annotated[
        list[int] | None, typer.Option("--batch", min=1, help="Batch size (repeatable; default 1, 10, 100).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Append 1 KiB records to the on-disk engine with fsync, beside a raw write+fsync loop.

    Example: waltz bench engine --dir /var/lib/waltz-storage --duration-s 5
    """
    if seconds is not None and records is not None:
        fail("give --duration-s or --records, not both")
    directory.mkdir(parents=True, exist_ok=True)
    results = engine_bench.run(
        directory,
        batch_sizes=tuple(batch_sizes or engine_bench.DEFAULT_BATCH_SIZES),
        seconds=seconds,
        records=records,
        progress=lambda message: err_console.print(f"[dim]{message}[/]"),
    )
    if as_json:
        print_json({"machine": _machine(), "results": [r.to_json() for r in results]})
        return
    table = Table(title=f"engine vs raw write+fsync, {engine_bench.RECORD_DATA_BYTES} B records")
    for column in ("batch", "records", "engine rec/s", "engine MB/s", "raw rec/s", "raw MB/s", "engine/raw"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            str(r.batch_size),
            str(r.engine.records),
            f"{r.engine.records_per_s:,.0f}",
            f"{r.engine.mb_per_s:.2f}",
            f"{r.raw.records_per_s:,.0f}",
            f"{r.raw.mb_per_s:.2f}",
            f"{r.ratio:.2f}",
        )
    console.print(table)


@app.command("crc")
@one_line_errors
def crc(as_json: JsonOption = False) -> None:
    """CRC-32 throughput: zlib.crc32 against crcmod's 'crc-32' for 100 B, 1 KiB and 64 KiB.

    Example: waltz bench crc --json
    """
    results = crc_bench.run()
    c_extension = crc_bench.crcmod_uses_c_extension()
    if as_json:
        print_json(
            {
                "machine": _machine(),
                "crcmod_c_extension": c_extension,
                "results": [r.to_json() for r in results],
            }
        )
        return
    table = Table(title=f"CRC-32 (crcmod C extension: {'yes' if c_extension else 'no'})")
    for column in ("implementation", "input", "ns/call", "MB/s"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r.implementation, f"{r.input_bytes} B", f"{r.ns_per_call:,.0f}", f"{r.mb_per_s:,.0f}")
    console.print(table)


@app.command("floor")
@one_line_errors
def floor_command(
    directory: Annotated[
        Path,
        typer.Option("--dir", "-d", help="A directory on the disk the storage nodes write to."),
    ] = Path("."),
    samples: Annotated[
        int, typer.Option("--samples", min=1, max=floor.MAX_SAMPLES, help="Measurements of each kind.")
    ] = floor.DEFAULT_SAMPLES,
    as_json: JsonOption = False,
) -> None:
    """The physical floor of a commit here, now: p50 of a small pwrite+fdatasync on --dir's disk,
    of three at once until the second is durable (a quorum of three replicas on one disk), and of a
    TLS round trip between two processes; a commit needs 2 round trips and the quorum fsync.
    Also the CPU floor of one request: a bare blocking-thread TLS echo of 64 bytes plus one
    600-byte write + fdatasync (CPU per commit of a storage node reads against twice it).

    Read a latency report against the floor of the same run: a busy machine moves both.

    Example: waltz bench floor --dir .waltz-dev --json
    """
    try:
        result = floor.measure(directory, samples)
    except floor.FloorError as e:
        fail(str(e))
    if as_json:
        print_json({"machine": _machine(), **result.to_json()})
        return
    table = Table(title=f"Commit floor on {directory} ({samples} samples each)")
    table.add_column("what")
    table.add_column("p50 ms", justify="right")
    table.add_row("pwrite + fdatasync", f"{result.fsync_p50_ms:.3f}")
    table.add_row(
        f"quorum fsync ({floor.QUORUM} of {floor.QUORUM_REPLICAS} at once)",
        f"{result.quorum_fsync_p50_ms:.3f}",
    )
    table.add_row("TLS round trip", f"{result.tls_round_trip_p50_ms:.3f}")
    table.add_row("commit floor (2 round trips + quorum fsync)", f"{result.commit_floor_ms:.3f}")
    console.print(table)
    console.print(
        f"CPU floor of one request: {result.request_cpu_floor_ms:.3f} ms = blocking-thread TLS echo of "
        f"{floor.MESSAGE_BYTES} B {result.echo_cpu_us:.1f} us + "
        f"{floor.SYNC_RECORD_BYTES} B write + fdatasync "
        f"{result.write_sync_cpu_us:.1f} us",
        markup=False,
        highlight=False,
    )


@app.command("storage")
@one_line_errors
@cluster_command
def storage(
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            "-d",
            help="Disk to measure: scratch ZooKeeper, node directory and raw-loop file go under it.",
        ),
    ] = Path("."),
    seconds: Annotated[
        float | None,
        typer.Option("--duration-s", min=0.1, help="Append for this many seconds in all (default 5)."),
    ] = None,
    requests: Annotated[
        int | None, typer.Option("--requests", min=1, help="Send this many APPEND requests instead.")
    ] = None,
    records_per_request: Annotated[
        int, typer.Option("--records-per-request", min=1, help="1 KiB records in each APPEND request.")
    ] = 100,
    in_flight: Annotated[
        int, typer.Option("--in-flight", min=1, help="APPEND requests outstanding at once on the connection.")
    ] = 8,
    storage_address: Annotated[
        str | None,
        typer.Option(
            "--storage", "-s", help="Measure this running node, HOST:DATA_PORT (with --admin-port, -z/-r)."
        ),
    ] = None,
    admin_port: Annotated[
        int | None, typer.Option("--admin-port", "-a", help="Admin port of --storage.")
    ] = None,
    partition: Annotated[
        int, typer.Option("--partition", "-p", min=0, help="Partition of --storage to append to.")
    ] = 0,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Append 100 x 1 KiB records per request to a storage node over TLS, pipelined, beside a
    raw write+fsync loop on the same disk.

    Without --storage it starts an embedded ZooKeeper (Java) and a node under --dir; -c/-z/-r
    matter only with --storage.

    Example: waltz bench storage --dir /var/lib/waltz-storage --duration-s 10 --in-flight 8
    """
    import tempfile

    from waltz_engine.bench import storage_node
    from waltz_engine.storage import admin_ops
    from waltz_engine.zk.connection import connect

    if seconds is not None and requests is not None:
        fail("give --duration-s or --requests, not both")
    directory.mkdir(parents=True, exist_ok=True)
    ssl_context = admin_ops.client_ssl_context(ssl_config)

    def measure(target: storage_node.NodeTarget, started_by_bench: bool) -> storage_node.StorageBenchResult:
        return storage_node.run(
            target,
            directory,
            seconds=seconds,
            requests=requests,
            records_per_request=records_per_request,
            in_flight=in_flight,
            node_started_by_bench=started_by_bench,
            progress=lambda message: err_console.print(f"[dim]{message}[/]"),
        )

    if storage_address is not None:
        if admin_port is None:
            fail("--storage needs --admin-port")
        address = parse_host_port(storage_address, "Storage", "host:data_port")
        settings = cluster.settings()
        with connect(settings) as client:
            layout = admin_ops.read_store_layout(client, settings.cluster_root)
        target = storage_node.NodeTarget(
            address, admin_port, layout.context(ssl_context, cluster.timeout_ms), partition
        )
        result = measure(target, False)
    else:
        with tempfile.TemporaryDirectory(prefix="waltz-bench-storage-", dir=directory) as work:
            err_console.print("[dim]starting an embedded ZooKeeper and a storage node[/]")
            with storage_node.own_node(Path(work), ssl_context) as target:
                result = measure(target, True)
    if as_json:
        print_json({"machine": _machine(), "result": result.to_json()})
        return
    node, raw = result.node, result.raw
    table = Table(
        title=f"storage node over TLS: {records_per_request} x {engine_bench.RECORD_DATA_BYTES} B records "
        f"per APPEND, {in_flight} in flight, one connection"
    )
    for column in ("loop", "records", "rec/s", "MB/s", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right")
    table.add_row(
        "node",
        str(node.records),
        f"{node.records_per_s:,.0f}",
        f"{node.mb_per_s:.2f}",
        f"{node.percentile_ms(50):.2f}",
        f"{node.percentile_ms(99):.2f}",
    )
    table.add_row(
        "raw write+fsync", str(raw.records), f"{raw.records_per_s:,.0f}", f"{raw.mb_per_s:.2f}", "", ""
    )
    console.print(table)
    console.print(f"node/raw: {result.ratio:.2f}")


# The client benchmarks bring a cluster of their own unless told of a running one: unlike other
# commands they do not fall back to the local dev cluster (-c .waltz-dev/client.yml says so).
BenchConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar=ENV_CONFIG,
        help="Client YAML of a running cluster (default: start a cluster of our own).",
    ),
]
BenchZooKeeperOption = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        "-z",
        envvar=ENV_ZOOKEEPER,
        help="ZooKeeper HOST:PORT of a running cluster (overrides --config; with --cluster-root).",
    ),
]
BenchRootOption = Annotated[
    str | None,
    typer.Option(
        "--cluster-root",
        "-r",
        envvar=ENV_CLUSTER_ROOT,
        help="Cluster root znode of a running cluster (overrides --config).",
    ),
]
WorkDirOption = Annotated[
    Path, typer.Option("--dir", "-d", help="Where our own cluster's ZooKeeper and nodes keep their files.")
]
StoragesOption = Annotated[
    int, typer.Option("--storages", min=1, help="Storage nodes of our own cluster (every one a replica).")
]
ActivePartitionsOption = Annotated[
    int,
    typer.Option("--num-active-partitions", min=1, help="Spread transactions over partitions 0..N-1."),
]
# The name before the original's -ap/--num-active-partitions was adopted (docs/benchmarks.md).
OldActivePartitionsOption = Annotated[int | None, typer.Option("--partitions", min=1, hidden=True)]
TxnSizeOption = Annotated[int, typer.Option("--txn-size", min=0, help="Bytes of data per transaction.")]


def _progress(message: str) -> None:
    err_console.print(f"[dim]{message}[/]")


def _active_partitions(partitions: int, old_partitions: int | None) -> int:
    """--num-active-partitions, or the hidden old spelling --partitions when that was given."""
    return partitions if old_partitions is None else old_partitions


@app.command("producers")
@one_line_errors
def producers_command(
    txn_size: TxnSizeOption = 512,
    txns_per_thread: Annotated[
        int, typer.Option("--txns-per-thread", min=1, help="Measured transactions per thread.")
    ] = 1000,
    threads: Annotated[int, typer.Option("--threads", min=1, help="Appender tasks.")] = 1,
    interval_ms: Annotated[
        float, typer.Option("--interval-ms", "-i", min=0, help="Mean (exponential) pause between submits.")
    ] = 0.0,
    partitions: ActivePartitionsOption = 1,
    old_partitions: OldActivePartitionsOption = None,
    lock_pool: Annotated[
        int, typer.Option("--lock-pool", "-l", min=0, help="Random write lock out of N (0: no locks).")
    ] = 0,
    max_in_flight: Annotated[
        int,
        typer.Option("--max-in-flight", min=1, help="Outstanding transactions per thread (original: 5)."),
    ] = 5,
    clients: Annotated[
        int, typer.Option("--clients", min=1, help="WaltzClients the threads share (original: one each).")
    ] = 1,
    mount_from_latest: Annotated[
        bool, typer.Option("--mount-from-latest", help="Mount at the current high-water marks.")
    ] = False,
    watchers: Annotated[
        int,
        typer.Option(
            "--watchers",
            min=0,
            help="N more connections fed every commit, as Java clients' network layers, in a process "
            "of their own (reported as 'watchers'): the cluster's fan-out cost without our client's.",
        ),
    ] = 0,
    mount_storm: Annotated[
        int | None,
        typer.Option(
            "--mount-storm",
            min=1,
            help="Instead: commit --threads x --txns-per-thread transactions, then N new clients "
            "mount at once while --threads appenders go on; report the mount times.",
        ),
    ] = None,
    config: BenchConfigOption = None,
    zookeeper: BenchZooKeeperOption = None,
    cluster_root: BenchRootOption = None,
    directory: WorkDirOption = Path("."),
    storages: StoragesOption = 3,
    as_json: JsonOption = False,
) -> None:
    """Commit throughput and latency: the original's PerformanceCli test-producers.

    Without -c/-z/-r it starts a cluster of its own under --dir (an embedded ZooKeeper,
    --storages storage nodes, one server) and removes it afterwards.

    Example: waltz bench producers --txn-size 512 --txns-per-thread 500 --threads 16 --interval-ms 0
    Example: waltz bench producers --mount-storm 200 --txns-per-thread 1000 --json
    Example: waltz bench producers --threads 64 --max-in-flight 5 --txns-per-thread 600 --watchers 63
    """
    from waltz_engine.bench import mount_storm as mount_storm_bench
    from waltz_engine.bench import producers

    partitions = _active_partitions(partitions, old_partitions)
    running = producers.RunningCluster(config, zookeeper, cluster_root)
    with producers.bench_cluster(running, directory, storages, partitions, _progress) as cluster:
        result: producers.ProducerResult | mount_storm_bench.MountStormResult
        if mount_storm is not None:
            result = mount_storm_bench.run(
                cluster,
                clients=mount_storm,
                partitions=partitions,
                backlog_txn_size=txn_size,
                backlog_txns_per_thread=txns_per_thread,
                backlog_threads=threads,
                max_in_flight=max_in_flight,
                mount_from_latest=mount_from_latest,
            )
        else:
            result = producers.run(
                cluster,
                txn_size=txn_size,
                txns_per_thread=txns_per_thread,
                threads=threads,
                interval_ms=interval_ms,
                partitions=partitions,
                lock_pool=lock_pool,
                clients=clients,
                max_in_flight=max_in_flight,
                mount_from_latest=mount_from_latest,
                watchers=watchers,
            )
    # The floor of the same run, on the disk the bench cluster wrote to: its latencies read
    # against it are comparable across machines and loads.
    _progress("measuring the commit floor (waltz bench floor)")
    _report(result, storages, as_json, floor.measure(directory))


def _report(result: Any, storages: int, as_json: bool, run_floor: floor.Floor | None = None) -> None:
    """A producers or consumers run: JSON with the machine, or the original's report lines; with
    the commit floor measured in the same run, when there is one."""
    if as_json:
        floor_json = {"floor": run_floor.to_json()} if run_floor is not None else {}
        print_json({"machine": _machine(), "storages": storages, **floor_json, "result": result.to_json()})
        return
    for line in result.report_lines():
        console.print(line, markup=False, highlight=False)
    if run_floor is None:
        return
    console.print(
        f"floor: commit {run_floor.commit_floor_ms:.2f} ms = 2 x TLS round trip "
        f"{run_floor.tls_round_trip_p50_ms:.2f} + quorum fsync {run_floor.quorum_fsync_p50_ms:.2f} "
        f"(one fsync {run_floor.fsync_p50_ms:.2f}; p50s); CPU floor of one request "
        f"{run_floor.request_cpu_floor_ms:.3f} ms",
        markup=False,
        highlight=False,
    )


@app.command("consumers")
@one_line_errors
def consumers_command(
    txn_size: TxnSizeOption = 512,
    txns: Annotated[int, typer.Option("--txns", min=1, help="Transactions to produce, then read.")] = 1000,
    partitions: ActivePartitionsOption = 1,
    old_partitions: OldActivePartitionsOption = None,
    config: BenchConfigOption = None,
    zookeeper: BenchZooKeeperOption = None,
    cluster_root: BenchRootOption = None,
    directory: WorkDirOption = Path("."),
    storages: StoragesOption = 3,
    as_json: JsonOption = False,
) -> None:
    """Read throughput and data fetch latency: the original's PerformanceCli test-consumers.

    Without -c/-z/-r it starts a cluster of its own under --dir, as `waltz bench producers`.

    Example: waltz bench consumers --txn-size 512 --txns 10000 --num-active-partitions 4
    """
    from waltz_engine.bench import consumers, producers

    partitions = _active_partitions(partitions, old_partitions)
    running = producers.RunningCluster(config, zookeeper, cluster_root)
    with producers.bench_cluster(running, directory, storages, partitions, _progress) as cluster:
        result = consumers.run(cluster, txn_size=txn_size, txns=txns, partitions=partitions)
    _report(result, storages, as_json)


@app.command("export")
@one_line_errors
def export_command(
    directory: Annotated[
        Path,
        typer.Option(
            "--dir", "-d", help="Working directory: the generated log (kept for reuse) and exports."
        ),
    ],
    rows: Annotated[int, typer.Option("--rows", min=1, help="Transactions in the log.")] = 2_000_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of the log.")] = 4,
    data_bytes: Annotated[
        int, typer.Option("--data-bytes", min=8, help="Bytes of data per transaction.")
    ] = 100,
    master: Annotated[str, typer.Option("--master", "-m", help="Spark master of the exports.")] = "local[2]",
    skip_export: Annotated[
        bool, typer.Option("--skip-export", help="Only generate the log and time the parser.")
    ] = False,
    warm_runs: Annotated[
        int, typer.Option("--warm-runs", min=0, help="Also time N exports in one session.")
    ] = 0,
    network: Annotated[
        bool,
        typer.Option(
            "--network", help="Serve the log from a storage node; export it over the network and locally."
        ),
    ] = False,
    tier: Annotated[
        bool,
        typer.Option(
            "--tier", help="With --network: also export the log from a file:// tier holding it (--tier-url)."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Rows/s of `waltz spark export` beside the segment parser alone in one process.

    Example: waltz bench export --dir /tmp/waltz-bench-export --rows 2000000 --warm-runs 3
    """
    from spark import bench_export, bench_network

    if tier and not network:
        fail("--tier goes with --network (the tier's export is compared with the network's)")
    if network:
        result = bench_network.run(
            directory, rows, partitions, data_bytes, master, progress=_progress, tier=tier
        )
    else:
        result = bench_export.run(
            directory,
            rows=rows,
            partitions=partitions,
            data_bytes=data_bytes,
            master=master,
            export_once=not skip_export,
            warm_runs=warm_runs,
            progress=_progress,
        )
    if as_json:
        print_json({"machine": _machine(), "result": result})
        return
    title = f"export of {rows:,} transactions x {data_bytes} B ({partitions} partitions, {master})"
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in result.items():
        table.add_row(name, f"{value:,}" if isinstance(value, int | float) else str(value))
    console.print(table)


@app.command("compare")
@one_line_errors
def compare_command(
    old: Annotated[Path, typer.Argument(help="The earlier report (`waltz bench ... --json > old.json`).")],
    new: Annotated[Path, typer.Argument(help="The later report of the same benchmark.")],
    as_json: JsonOption = False,
) -> None:
    """Compare two saved reports of the same benchmark: every figure, old, new and new/old.

    Save each report with --json (`waltz bench producers ... --json > before.json`, change
    something, then the same again into after.json).

    Example: waltz bench compare before.json after.json
    """
    from rich.markup import escape

    from waltz_engine.bench.compare import compare, load_report

    rows = compare(load_report(old), load_report(new))
    if as_json:
        print_json({"old": str(old), "new": str(new), "figures": [r.to_json() for r in rows]})
        return
    table = Table(title=f"{new} against {old}")
    for name in ("figure", "old", "new", "new/old"):
        table.add_column(name, justify="left" if name == "figure" else "right")
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        table.add_row(escape(r.metric), f"{r.old:,.4g}", f"{r.new:,.4g}", ratio)
    console.print(table)
