"""The ``waltz`` command: one typer app, one module per command group."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from typing import Any

import typer

from waltz_cli import INTERRUPTED_EXIT
from waltz_cli.options import CONTEXT_SETTINGS, WaltzGroup
from waltz_cli.output import fail, warn
from waltz_engine import __version__

_app = typer.Typer(
    name="waltz",
    cls=WaltzGroup,
    help="Waltz: a distributed, replicated write-ahead log (byte-compatible with Waltz 0.13.2).",
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
    pretty_exceptions_enable=False,
)


class _WarningLine(logging.Handler):
    """Warnings the library logs while a command runs (an unknown config key) as `warning: ...`."""

    def emit(self, record: logging.LogRecord) -> None:
        warn(record.getMessage())


_config_log = logging.getLogger("waltz_engine.common.config")
_config_log.addHandler(_WarningLine(logging.WARNING))
_config_log.propagate = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"waltz {__version__} (compatible with Waltz 0.13.2)")
        raise typer.Exit()


@_app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Waltz: a distributed, replicated write-ahead log."""


# Where each command lives: `waltz storage start` imports only the storage group's module (a
# command's start costs what it uses, not every group's engine code); help and unknown names
# register them all.
_COMMANDS = {
    "tail": ("feed", "tail"),
    "append": ("feed", "append"),
    "create-cluster": ("zk", "create_cluster"),
    "recover": ("recovery", "recover"),
    "truncate": ("recovery", "truncate"),
    "top": ("top", "top"),
    "smoke": ("smoke", "smoke"),
    "sim": ("sim", "sim"),
}
_GROUPS = (
    "inspect", "zk", "storage", "server", "cluster", "client", "dev",
    "retention", "spark", "bench", "backup",
)  # fmt: skip
_registered: set[str] = set()


def _register(only: str | None = None) -> None:
    for name, (module, function) in _COMMANDS.items():
        if only in (None, name) and name not in _registered:
            _registered.add(name)
            _app.command(name)(getattr(_commands(module), function))
    for name in _GROUPS:
        if only in (None, name) and name not in _registered:
            _registered.add(name)
            _app.add_typer(_commands(name).app, name=name)


def _commands(module: str) -> Any:
    return importlib.import_module(f"waltz_cli.commands.{module}")


def _command_named(args: list[str]) -> str | None:
    """The command that ``args`` run, if it is one name of ours; None to register every command."""
    if args and (args[0] in _COMMANDS or args[0] in _GROUPS):
        return args[0]
    return None


def __getattr__(name: str) -> Any:
    # `from waltz_cli.main import app` (tests, embedders) gets the app with every command.
    if name == "app":
        _register()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    # The command's modules are imported under the start-up handler (one line, exit 130), then a
    # Ctrl-C is Python's KeyboardInterrupt again, so that a running command cleans up after
    # itself: WaltzGroup turns it into one line, and so does this for what happens outside it.
    _register(_command_named(sys.argv[1:]))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _app(prog_name="waltz")
    except KeyboardInterrupt:
        try:
            fail("interrupted", INTERRUPTED_EXIT)
        except typer.Exit as done:  # outside the app: nobody else turns it into the exit status
            sys.exit(done.exit_code)


if __name__ == "__main__":
    main()
