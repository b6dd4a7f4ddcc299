"""`waltz server ...`: run a Waltz server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waltz_cli import options

app = options.group(help="Run a Waltz server (the client-facing node).")

ConfigFileOption = Annotated[
    Path,
    typer.Option(
        "--config", "-c", help="Server YAML (server.port, zookeeper.connectString, cluster.root ...)."
    ),
]
LogLevelOption = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]


@app.callback()
def _group() -> None:
    """Run a Waltz server (the client-facing node)."""


@app.command("start")
def start(config: ConfigFileOption, log_level: LogLevelOption = "info") -> None:
    """Run a server until SIGTERM/SIGINT (the original's WaltzServer).

    Example: waltz server start --config server.yml
    """
    # Imported here so that other `waltz` commands do not pay for the server's imports.
    from waltz_engine.server.server import run

    raise typer.Exit(run(config, log_level))


def _register_admin() -> None:
    from waltz_cli.commands import server_admin

    server_admin.register(app)


_register_admin()
