"""`waltz inspect`: read-only views of storage files and wire frames."""

from __future__ import annotations

import typer

from waltz_cli.commands import frame as frame_command

app = typer.Typer(
    help="Read-only inspection of storage files and wire frames (never modifies a file).",
    no_args_is_help=True,
)

app.command("frame")(frame_command.frame)
