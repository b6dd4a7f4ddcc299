"""`waltz tail` and `waltz append`: read and write one partition from the command line.

Both use --config (a client YAML), else the local dev cluster's .waltz-dev/client.yml.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from waltz_cli.decoder import Decoder, load_decoder
from waltz_cli.output import fail, one_line_errors, print_json
from waltz_engine import client_tools
from waltz_engine.client_tools import DEFAULT_TIMEOUT_MS, AppendItem, TailedTransaction

STDIN = "-"

ClientConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        "--cli-config-path",  # the original ClientCli's name
        help="Client YAML (zookeeper.connectString, cluster.root); default .waltz-dev/client.yml.",
    ),
]
PartitionOption = Annotated[int, typer.Option("--partition", "-p", help="Partition id.")]
TimeoutOption = Annotated[
    int, typer.Option("--timeout-ms", help="Give up on an unreachable server after this long.", min=1)
]


def run_async(stream: AsyncIterator[Any], on_item: Callable[[Any], None]) -> None:
    """Drive an async generator to its end; Ctrl-C stops it cleanly (the client is closed)."""

    async def drive() -> None:
        async for item in stream:
            on_item(item)
            sys.stdout.flush()

    try:
        asyncio.run(drive())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _readable(data: bytes) -> str:
    """Printable UTF-8 as a quoted string (what people append from a shell), anything else as hex."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()
    return json.dumps(text, ensure_ascii=False) if text.isprintable() else data.hex()


def _render(decoder: Decoder | None, as_json: bool) -> Callable[[TailedTransaction], None]:
    def show(item: TailedTransaction) -> None:
        decoded = decoder(item.data) if decoder is not None and item.data is not None else None
        if as_json:
            value = item.to_json()
            if decoder is not None:
                value["decoded"] = (
                    decoded if isinstance(decoded, (dict, list, int, float, bool)) else str(decoded)
                )
            print_json(value)
            return
        line = f"{item.transaction_id}\theader={item.header}\treqId={item.req_id}"
        if item.data is not None:
            line += f"\tdata={decoded if decoder is not None else _readable(item.data)}"
        typer.echo(line)

    return show


@one_line_errors
def tail(
    partition: PartitionOption,
    from_transaction: Annotated[
        int, typer.Option("--from", help="First transaction id to print (default: the beginning).")
    ] = 0,
    from_latest: Annotated[
        bool, typer.Option("--from-latest", help="Print only transactions appended from now on.")
    ] = False,
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
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per transaction.")] = False,
    config: ClientConfigOption = None,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Print a partition's transactions (id, header, reqId, data) as they are committed.

    Example: waltz tail --partition 3 --from-latest --data --json
    """
    decode = load_decoder(decoder) if decoder is not None else None
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    stream = client_tools.tail(
        client_config,
        partition,
        from_transaction=None if from_latest else from_transaction,
        follow=follow,
        with_data=data or decode is not None,
        timeout_ms=timeout_ms,
    )
    run_async(stream, _render(decode, as_json))


def _items(data: str | None, header: int, locks: tuple[Any, ...]) -> Iterator[AppendItem]:
    if data is not None and data != STDIN:
        yield AppendItem(data.encode(), header, locks)
        return
    for line in sys.stdin:
        yield AppendItem(line.rstrip("\n").encode(), header, locks)


@one_line_errors
def append(
    partition: PartitionOption,
    data: Annotated[
        str | None, typer.Argument(help="The data (UTF-8); '-' or nothing: one transaction per stdin line.")
    ] = None,
    header: Annotated[int, typer.Option("--header", help="The transaction header (int32).")] = 0,
    lock: Annotated[list[str] | None, typer.Option("--lock", help="Write lock NAME:ID (repeatable).")] = None,
    config: ClientConfigOption = None,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Append one transaction (or one per stdin line) and print each committed transaction id.

    Example: waltz append --partition 0 --lock account:42 'deposit 10'
    """
    if not -(2**31) <= header < 2**31:
        fail(f"--header must be an int32, got {header}")
    locks = tuple(client_tools.parse_lock(text) for text in lock or [])
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    stream = client_tools.append(client_config, partition, _items(data, header, locks), timeout_ms=timeout_ms)
    run_async(stream, lambda txid: typer.echo(str(txid)))
