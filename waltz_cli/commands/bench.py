"""`waltz bench ...`: benchmarks (never tests) of the engine, nodes and clients."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from waltz_cli.output import console, err_console, fail, one_line_errors, print_json
from waltz_engine.bench import crc_bench, engine_bench

app = typer.Typer(help="Benchmarks: measure throughput and latency on this machine.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]


def _machine() -> dict[str, object]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}


@app.command("engine")
@one_line_errors
def engine(
    directory: Annotated[
        Path,
        typer.Option("--dir", help="Directory on the disk to measure (a scratch sub-directory is used)."),
    ] = Path("."),
    seconds: Annotated[
        float | None, typer.Option("--seconds", min=0.1, help="Run each engine loop this long (default 3).")
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

    Example: waltz bench engine --dir /var/lib/waltz-storage --seconds 5
    """
    if seconds is not None and records is not None:
        fail("give --seconds or --records, not both")
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
