"""`waltz storage ...`: run a storage node, and administer running ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waltz_cli import options
from waltz_cli.commands import storage_admin, storage_moves

app = options.group(help="Run a storage node and administer running storage nodes.")

storage_admin.register(app)
app.command("decommission")(storage_moves.decommission)


ConfigFileOption = Annotated[
    Path,
    typer.Option("--config", "-c", help="Storage node YAML (storage.port, storage.directory ...)."),
]
LogLevelOption = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]


@app.command("start")
def start(config: ConfigFileOption, log_level: LogLevelOption = "info") -> None:
    """Run a storage node until SIGTERM/SIGINT (the original's WaltzStorage).

    An append is acknowledged once its records are synced. A disk pass of several busy partitions
    syncs them with one syncfs where the kernel (5.8+) and file system (ext4, xfs, btrfs) make that
    safe: storage.sync.scope auto (default), file (each file's own fdatasync) or file-system. A
    syncfs also flushes other writers' data on that volume: give the directory its own, or use file.

    Example: waltz storage start --config storage.yml
    """
    # Imported here so that other `waltz` commands do not pay for the node's imports.
    from waltz_engine.storage.node import run

    raise typer.Exit(run(config, log_level))
