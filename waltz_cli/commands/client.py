"""`waltz client ...`: the original's ClientCli (reference §4.4) — validate, high-water-mark,
create-producer, create-consumer. The cluster is found as everywhere (-c/-z/-r, else
.waltz-dev/client.yml); the original's -tpc, -nc, -ap and --cli-config-path still work."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

import typer

from waltz_cli.options import (
    FROM_OPTIONS,
    AllPartitionsOption,
    Cluster,
    JsonOption,
    OptionalPartitionsOption,
    chosen_partitions,
    cluster_command,
    group,
)
from waltz_cli.output import one_line_errors, print_json
from waltz_engine.ops import client_tools
from waltz_engine.ops.client_tools import DEFAULT_CONSUMER_IDLE_TIMEOUT_MS, ProducerSpec

T = TypeVar("T")
INTERRUPTED = 130

app = group(help="Client tools: validate a cluster, read high-water marks, run producers and consumers.")

TxnPerClientOption = Annotated[int, typer.Option("--txn-per-client", help="Transactions per client.", min=0)]
IntervalOption = Annotated[
    float,
    typer.Option("--interval-ms", "-i", help="Average ms between transactions (exponential).", min=0),
]
ActivePartitionsOption = Annotated[
    int, typer.Option("--num-active-partitions", help="Use partitions 0..N-1.", min=1)
]
IdleTimeoutOption = Annotated[
    int,
    typer.Option(
        "--idle-timeout-ms", help="Consumer: fail when no transaction arrives for this long.", min=1
    ),
]


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coroutine)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


@app.command("validate")
@one_line_errors
@cluster_command
def validate(
    txn_per_client: TxnPerClientOption,
    num_clients: Annotated[int, typer.Option("--num-clients", help="Producer clients.", min=1)],
    interval_ms: IntervalOption,
    num_active_partitions: ActivePartitionsOption = 1,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Submit transactions for validation: every committed transaction must carry its own id.

    Example: waltz client validate --txn-per-client 30 --num-clients 3 -i 10

    Example: waltz client validate --txn-per-client 5 --num-clients 2 -i 0 -z localhost:2181 -r /waltz
    """
    client_config = cluster.client_config()
    _run(
        client_tools.validate(
            client_config, txn_per_client, num_clients, interval_ms, num_active_partitions, cluster.timeout_ms
        )
    )


@app.command("high-water-mark")
@one_line_errors
@cluster_command
def high_water_mark(
    partition: OptionalPartitionsOption = None,
    every: AllPartitionsOption = False,
    as_json: JsonOption = False,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Display the high-water marks of partitions (the server's; -1: no transaction yet).

    With --json: one {"partition": P, "high_water_mark": N} per partition (JSON lines).

    Example: waltz client high-water-mark -p 0 --json

    Example: waltz client high-water-mark --all
    """
    wanted = chosen_partitions(partition, every)
    client_config = cluster.client_config()
    marks = _run(client_tools.high_water_marks(client_config, wanted))
    for partition_id, mark in marks.items():
        if as_json:
            print_json({"partition": partition_id, "high_water_mark": mark})
        else:
            typer.echo(f"Partition {partition_id} current high watermark: {mark}")


@app.command("create-producer")
@one_line_errors
@cluster_command
def create_producer(
    txn_per_client: TxnPerClientOption,
    interval_ms: IntervalOption,
    num_active_partitions: ActivePartitionsOption = 1,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Run one producer of validated transactions (data == its transaction id).

    Example: waltz client create-producer --txn-per-client 10 -i 5
    """
    client_config = cluster.client_config()
    spec = ProducerSpec(txn_per_client, interval_ms, num_active_partitions)
    _run(client_tools.produce(client_config, spec, cluster.timeout_ms))


@app.command("create-consumer")
@one_line_errors
@cluster_command
def create_consumer(
    txn_per_client: Annotated[int, typer.Option("--txn-per-client", help="Transactions to consume.", min=0)],
    num_active_partitions: ActivePartitionsOption = 1,
    idle_timeout_ms: IdleTimeoutOption = DEFAULT_CONSUMER_IDLE_TIMEOUT_MS,
    cluster: Cluster = FROM_OPTIONS,
) -> None:
    """Run one consumer that checks the order and that data == transaction id.

    Example: waltz client create-consumer --txn-per-client 100
    """
    client_config = cluster.client_config()
    _run(client_tools.consume(client_config, txn_per_client, num_active_partitions, idle_timeout_ms))
