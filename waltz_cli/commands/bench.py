"""`waltz bench ...`: benchmarks (never tests) of the engine, nodes and clients."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks: measure throughput and latency on this machine.", no_args_is_help=True)
