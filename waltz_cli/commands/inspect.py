"""`waltz inspect`: read-only views of storage files and wire frames.

The storage commands are a thin skin over :mod:`waltz_engine.ops.inspect`: each calls one
library function, then renders its result as a table (people) or JSON (``--json``, scripts).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from waltz_cli import options
from waltz_cli.commands import frame as frame_command
from waltz_cli.options import JsonOption
from waltz_cli.output import console, fail, human_size, one_line_errors, print_json
from waltz_engine.common.decoder import load_decoder
from waltz_engine.ops.inspect import inspect_control, inspect_segment, segment_stats, verify

app = options.group(help="Read-only inspection of storage files and wire frames (never modifies a file).")

app.command("frame")(frame_command.frame)

# Tables show this much of a record's data; --json always has all of it.
DATA_PREVIEW_BYTES = 32
MILLIS_PER_SECOND = 1000
MISSING = "-"


@app.command("control")
@one_line_errors
def control(
    path: Annotated[Path, typer.Argument(help="waltz-storage.ctl, or the storage directory holding it.")],
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", min=0, help="Show only this partition.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show the control file: cluster key and, per partition, session, low-water marks, flags and the
    segments and bytes on this disk (a node with a tier holds its evicted ones in the object store).

    Exits 1 when a partition cannot be used (both of its structs fail their checksum); the others are shown.

    Example: waltz inspect control /var/lib/waltz-storage --partition 1
    """
    result = inspect_control(path, partition)
    if as_json:
        print_json(result)
    else:
        _render_control(result)
    corrupted = [str(p["partition_id"]) for p in result["partitions"] if p["corrupted"]]
    if corrupted:
        fail(
            f"{result['path']}: partition {', '.join(corrupted)}: "
            "partition info corrupted (both structs fail their checksum)"
        )
    if result["problems"]:
        fail(f"{result['path']}: {'; '.join(result['problems'])}")


def _render_control(result: dict[str, Any]) -> None:
    console.print(f"[bold]Control file[/]  {escape(result['path'])}")
    console.print(f"Cluster key   {result['key']}")
    console.print(f"Created       {_time(result['creation_time'])}")
    console.print(f"Version       {result['version']}    Partitions: {result['num_partitions']}")
    columns = ("Part", "Session", "LWM", "Local LWM", "Assigned", "Avail", "Flags", "Seq", "Struct", "Local")
    table = Table(*columns)
    notes: list[str] = []
    for p in result["partitions"]:
        if p["corrupted"]:
            table.add_row(str(p["partition_id"]), "[bold red]CORRUPTED[/]", *[MISSING] * 8)
        else:
            other_valid = p["struct2_valid"] if p["current_struct"] == 1 else p["struct1_valid"]
            struct = f"{p['current_struct']}" + ("" if other_valid else " [yellow](other damaged)[/]")
            values = (p["session_id"], p["low_water_mark"], p["local_low_water_mark"])
            flags = (p["assigned"], p["available"], p["flags"], p["sequence_number"])
            local = f"{p['local_segments']} seg, {p['local_bytes']} B"
            table.add_row(str(p["partition_id"]), *map(str, values), *map(_text, flags), struct, local)
        notes.extend(f"partition {p['partition_id']}: {message}" for message in p["problems"])
    console.print(table)
    for note in notes:
        console.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)


@app.command("segment")
@one_line_errors
def segment(
    path: Annotated[Path, typer.Argument(help="A segment data file (<partition dir>/<first txid>.seg).")],
    transaction: Annotated[
        int | None,
        typer.Option(
            "--transaction", "-t", min=0, help="Start at this transaction id (alone: show only it)."
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--max", min=0, help="Show at most N records (from --transaction).")
    ] = None,
    decoder: Annotated[
        str | None,
        typer.Option(
            "--decoder", help="module:function turning record data (bytes) into something readable."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show a segment's header and its records, with torn or unindexed records reported.

    Records are read in file order and checked against the index (the .idx beside the .seg) and checksums.

    Whatever does not check out is listed after the records.

    Example: waltz inspect segment storage/0/0000000000000000000.seg -t 10 --max 5 --decoder app.codec:decode
    """
    decode = load_decoder(decoder) if decoder else None
    result = inspect_segment(path, transaction=transaction, limit=limit, decoder=decode)
    if as_json:
        print_json(result)
        return
    header = result["header"]
    console.print(f"[bold]Segment[/]   {escape(result['path'])}")
    console.print(
        f"Partition {header['partition_id']}, first txid {header['first_transaction_id']}, "
        f"key {header['key']}, version {header['version']}, created {_time(header['creation_time'])}"
    )
    console.print(f"Data {human_size(result['data_size_bytes'])}, index {result['index_entries']} entries")
    table = Table("TxID", "Offset", "ReqId c/g/p/s", "Header", "Checksum", "Data (hex)", "Text")
    if decode:
        table.add_column("Decoded")
    for r in result["records"]:
        ok = r["checksum_ok"] and r["record_checksum_ok"]
        checks = str(r["checksum"]) if ok else f"[bold red]{r['checksum']} BAD[/]"
        req_id = f"{r['client_id']}/{r['generation']}/{r['partition_id']}/{r['seq_num']}"
        data = bytes.fromhex(r["data_hex"])
        more = f"…(+{len(data) - DATA_PREVIEW_BYTES})" if len(data) > DATA_PREVIEW_BYTES else ""
        row = [str(r["transaction_id"]), str(r["offset"]), req_id, str(r["header"]), checks]
        row += [data[:DATA_PREVIEW_BYTES].hex() + more, escape(r["data_text"][:DATA_PREVIEW_BYTES]) + more]
        if decode:
            decoded = escape(str(r["decoded"])) if "decoded" in r else f"[red]{escape(r['decode_error'])}[/]"
            row.append(decoded)
        table.add_row(*row)
    console.print(table)
    _print_problems(result["problems"])


def _print_problems(problems: Iterable[dict[str, Any]]) -> None:
    for p in problems:
        txid = f"txid {p['transaction_id']}: " if p["transaction_id"] is not None else ""
        console.print(f"[bold red]problem[/] {p['kind']}: {txid}{escape(p['message'])}", soft_wrap=True)


@app.command("verify")
@one_line_errors
def verify_command(
    path: Annotated[
        Path, typer.Argument(help="A storage directory, its waltz-storage.ctl, or one .seg file.")
    ],
    as_json: JsonOption = False,
) -> None:
    """Check index consistency, headers and both checksums of every record; exit 1 on any problem.

    A storage directory is checked whole: control file structs and every segment of every partition.

    Each problem is printed on its own line: file, txid, kind and what is wrong.

    Example: waltz inspect verify /var/lib/waltz-storage
    """
    report = verify(path)
    if as_json:
        print_json(report.to_json())
    else:
        for p in report.problems:
            txid = f" txid {p.transaction_id}" if p.transaction_id is not None else ""
            line = f"{p.file}{txid}: {p.kind}: {p.message}"
            console.print(f"[bold red]FAIL[/] {escape(line)}", soft_wrap=True)
        if report.ok:
            console.print(f"[green]OK[/] {escape(report.path)}: {report.summary()}", soft_wrap=True)
    if not report.ok:
        fail(f"{report.path}: verification failed: {report.summary()}")


@app.command("stats")
@one_line_errors
def stats(
    path: Annotated[Path, typer.Argument(help="A .seg file, a partition directory or a storage directory.")],
    as_json: JsonOption = False,
) -> None:
    """Record count and data size min/max/mean/median, one row per segment.

    Sizes are of the record data, as in the original's segment-statistic; empty segments show "-" (JSON null).

    Example: waltz inspect stats /var/lib/waltz-storage --json
    """
    rows = segment_stats(path)
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    table = Table("Segment", "Part", "First txid", "Records", "Min", "Max", "Mean", "Median", "Bytes")
    table.columns[0].overflow = "fold"
    for row in rows:
        mean = MISSING if row.mean_data_bytes is None else f"{row.mean_data_bytes:.2f}"
        table.add_row(
            escape(row.file),
            *map(_text, (row.partition_id, row.first_transaction_id, row.record_count)),
            *map(_text, (row.min_data_bytes, row.max_data_bytes)),
            mean,
            _text(row.median_data_bytes),
            _text(row.total_data_bytes),
        )
    console.print(table)
    damaged = [row.file for row in rows if row.problem_count]
    if damaged:
        files = escape(", ".join(damaged))
        console.print(f"[yellow]warning:[/] problems in {files} (see `waltz inspect verify`)", soft_wrap=True)


def _text(value: object) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _time(millis: int) -> str:
    try:
        moment = datetime.fromtimestamp(millis / MILLIS_PER_SECOND, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return str(millis)  # a damaged header; the raw number is all there is
    return f"{millis} ({moment.isoformat(timespec='milliseconds')})"
