"""`waltz tail` and `waltz append`: read partitions and write one from the command line.

Both find the cluster as every command does (-c/-z/-r, else .waltz-dev/client.yml).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Annotated, Any

import typer

from waltz_cli.options import (
    FROM_OPTIONS,
    AllPartitionsOption,
    Cluster,
    JsonOption,
    OptionalPartitionsOption,
    PartitionOption,
    chosen_partitions,
    cluster_command,
)
from waltz_cli.output import note, one_line_errors, print_json, usage_error
from waltz_engine.common.decoder import Decoder, load_decoder, try_decode
from waltz_engine.ops import client_tools
from waltz_engine.ops.client_tools import AppendItem, ClientToolError, TailedTransaction, TailRange

STDIN = "-"
INTERRUPTED = 130


def run_async(stream: AsyncGenerator[Any, None], on_item: Callable[[Any], None]) -> None:
    """Drive an async generator to its end; Ctrl-C stops it cleanly (the client is closed).

    The generator is closed inside the loop whatever happens (a closed pipe included), so its
    client is closed there and nothing is left for the interpreter to complain about at exit.
    """

    async def drive() -> None:
        async with contextlib.aclosing(stream):
            async for item in stream:
                on_item(item)
                sys.stdout.flush()

    try:
        asyncio.run(drive())
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


def _readable(data: bytes) -> str:
    """Printable UTF-8 as a quoted string (what people append from a shell), anything else as hex."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()
    return json.dumps(text, ensure_ascii=False) if text.isprintable() else data.hex()


def _render(
    decoder: Decoder | None, as_json: bool, with_partition: bool
) -> Callable[[TailedTransaction], None]:
    def show(item: TailedTransaction) -> None:
        decoded, error = (
            try_decode(decoder, item.data) if decoder is not None and item.data is not None else (None, None)
        )
        if as_json:
            value = item.to_json()
            if error is not None:
                value["decode_error"] = error
            elif decoder is not None:
                value["decoded"] = (
                    decoded if isinstance(decoded, (dict, list, int, float, bool)) else str(decoded)
                )
            print_json(value)
            return
        line = f"{item.transaction_id}\theader={item.header}\treqId={item.req_id}"
        if with_partition:
            line = f"partition={item.partition_id}\t{line}"
        if error is not None:
            line += f"\tdecode_error={error}\tdata={_readable(item.data or b'')}"
        elif item.data is not None:
            line += f"\tdata={decoded if decoder is not None else _readable(item.data)}"
        typer.echo(line)

    return show


@one_line_errors
@cluster_command
def tail(
    partition: OptionalPartitionsOption = None,
    every: AllPartitionsOption = False,
    from_transaction: Annotated[
        int,
        typer.Option(
            "--from",
            min=0,
            help="First transaction id to print; waited for when following, a partition that does not "
            "reach it is skipped with --no-follow.",
        ),
    ] = 0,
    from_latest: Annotated[
        bool, typer.Option("--from-latest", help="Print only transactions appended from now on.")
    ] = False,
    to_transaction: Annotated[
        int | None,
        typer.Option("--to", min=0, help="Last transaction id to print (inclusive), then stop."),
    ] = None,
    max_transactions: Annotated[
        int | None, typer.Option("--max", min=1, help="Stop after this many transactions in all.")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--no-follow", help="Keep waiting for new ones, or stop at the current high-water mark."
        ),
    ] = True,
    data: Annotated[bool, typer.Option("--data", help="Fetch and print each transaction's data.")] = False,
    decoder: Annotated[
        str | None,
        typer.Option(
            "--decoder", help="module:function turning data bytes into something readable (implies --data)."
        ),
    ] = None,
    as_json: JsonOption = False,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Print transactions (id, header, reqId, data) of one or more partitions as they are committed.

    With --json: one object per transaction with partition, transaction_id, header, client_id,
    generation, seq_num and, with --data, data_hex and data (the text, when it is UTF-8).

    Example: waltz tail -p 3 --from-latest --data --json

    Example: waltz tail -p 0,2-3 --from 100 --to 199 --no-follow

    Example: waltz tail --all --max 10 -z localhost:2181 -r /waltz
    """
    partitions = chosen_partitions(partition, every)
    decode = load_decoder(decoder) if decoder is not None else None
    try:
        span = TailRange(None if from_latest else from_transaction, to_transaction, max_transactions)
    except ClientToolError as e:  # flags that contradict each other: a usage error
        usage_error(str(e))
    client_config = cluster.client_config()
    stream = client_tools.tail(
        client_config,
        partitions,
        span=span,
        follow=follow,
        with_data=data or decode is not None,
        timeout_ms=cluster.timeout_ms,
        note=note,
    )
    run_async(stream, _render(decode, as_json, with_partition=partitions is None or len(partitions) > 1))


def _items(data: str | None, header: int, locks: tuple[Any, ...]) -> Iterator[AppendItem]:
    if data is not None and data != STDIN:
        yield AppendItem(data.encode(), header, locks)
        return
    for line in sys.stdin:
        yield AppendItem(line.rstrip("\n").encode(), header, locks)


@one_line_errors
@cluster_command
def append(
    partition: PartitionOption,
    data: Annotated[
        str | None, typer.Argument(help="The data (UTF-8); '-' or nothing: one transaction per stdin line.")
    ] = None,
    header: Annotated[int, typer.Option("--header", help="The transaction header (int32).")] = 0,
    lock: Annotated[list[str] | None, typer.Option("--lock", help="Write lock NAME:ID (repeatable).")] = None,
    as_json: JsonOption = False,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Append one transaction (or one per stdin line) to one partition and print each committed
    transaction id ("partition 1: committed transaction 42").

    With --json: one object per committed transaction, {"partition": P, "transaction_id": T}.

    Example: waltz append -p 0 --lock account:42 'deposit 10'

    Example: waltz append -p 1 --json - < lines.txt
    """
    if not -(2**31) <= header < 2**31:
        usage_error(f"--header must be an int32, got {header}")
    locks = tuple(client_tools.parse_lock(text) for text in lock or [])
    client_config = cluster.client_config()
    stream = client_tools.append(
        client_config, partition, _items(data, header, locks), timeout_ms=cluster.timeout_ms
    )

    def show(transaction_id: int) -> None:
        if as_json:
            print_json({"partition": partition, "transaction_id": transaction_id})
        else:
            typer.echo(f"partition {partition}: committed transaction {transaction_id}")

    run_async(stream, show)
