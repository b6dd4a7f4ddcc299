"""`waltz zk ...` and `waltz create-cluster`: the embedded ZooKeeper and cluster metadata."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run an embedded ZooKeeper and manage cluster metadata in it.", no_args_is_help=True)


def create_cluster() -> None:
    """Create a new Waltz cluster in ZooKeeper."""
    raise NotImplementedError
