"""`waltz client ...`: the original's ClientCli (reference §4.4) — validate, high-water-mark,
create-producer, create-consumer. -c is a client YAML; default .waltz-dev/client.yml."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer

from waltz_cli.commands.feed import ClientConfigOption, TimeoutOption
from waltz_cli.output import one_line_errors
from waltz_engine import client_tools
from waltz_engine.client_tools import DEFAULT_CONSUMER_IDLE_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, ProducerSpec

T = TypeVar("T")

app = typer.Typer(
    help="Client tools: validate a cluster, read high-water marks, run producers and consumers.",
    no_args_is_help=True,
)

TxnPerClientOption = Annotated[
    int, typer.Option("--txn-per-client", "-tpc", help="Transactions per client.", min=0)
]
IntervalOption = Annotated[
    float, typer.Option("--interval", "-i", help="Average ms between transactions (exponential).", min=0)
]
ActivePartitionsOption = Annotated[
    int, typer.Option("--num-active-partitions", "-ap", help="Use partitions 0..N-1.", min=1)
]
IdleTimeoutOption = Annotated[
    int,
    typer.Option(
        "--idle-timeout-ms", help="Consumer: fail when no transaction arrives for this long.", min=1
    ),
]


@app.callback()
def _group() -> None:
    """Client tools (the original's ClientCli)."""


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coroutine)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command("validate")
@one_line_errors
def validate(
    txn_per_client: TxnPerClientOption,
    num_clients: Annotated[int, typer.Option("--num-clients", "-nc", help="Producer clients.", min=1)],
    interval: IntervalOption,
    config: ClientConfigOption = None,
    num_active_partitions: ActivePartitionsOption = 1,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Submit transactions for validation: every committed transaction must carry its own id.

    Example: waltz client validate -tpc 30 -nc 3 -i 10
    """
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    _run(
        client_tools.validate(
            client_config, txn_per_client, num_clients, interval, num_active_partitions, timeout_ms
        )
    )


@app.command("high-water-mark")
@one_line_errors
def high_water_mark(
    partition: Annotated[int, typer.Option("--partition", "-p", help="Partition id.")],
    config: ClientConfigOption = None,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Displays high water mark of given partition."""
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    mark = _run(client_tools.high_water_mark(client_config, partition))
    typer.echo(f"Partition {partition} current high watermark: {mark}")


@app.command("create-producer")
@one_line_errors
def create_producer(
    txn_per_client: TxnPerClientOption,
    interval: IntervalOption,
    config: ClientConfigOption = None,
    num_active_partitions: ActivePartitionsOption = 1,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Creates one producer of validated transactions."""
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    spec = ProducerSpec(txn_per_client, interval, num_active_partitions)
    _run(client_tools.produce(client_config, spec, timeout_ms))


@app.command("create-consumer")
@one_line_errors
def create_consumer(
    txn_per_client: Annotated[
        int, typer.Option("--txn-per-client", "-tpc", help="Transactions to consume.", min=0)
    ],
    config: ClientConfigOption = None,
    num_active_partitions: ActivePartitionsOption = 1,
    idle_timeout_ms: IdleTimeoutOption = DEFAULT_CONSUMER_IDLE_TIMEOUT_MS,
    timeout_ms: TimeoutOption = DEFAULT_TIMEOUT_MS,
) -> None:
    """Creates one consumer that checks order and data == transaction id."""
    client_config = client_tools.load_client_config(config, timeout_ms=timeout_ms)
    _run(client_tools.consume(client_config, txn_per_client, num_active_partitions, idle_timeout_ms))
