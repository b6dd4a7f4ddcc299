"""The ``waltz`` command: one typer app, one module per command group."""

from __future__ import annotations

import logging
import signal

import typer

from waltz_cli.options import CONTEXT_SETTINGS, WaltzGroup
from waltz_cli.output import warn
from waltz_engine import __version__

app = typer.Typer(
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


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Waltz: a distributed, replicated write-ahead log."""


def _register() -> None:
    # Imported here so that `waltz --help` stays one place that lists every group.
    from waltz_cli.commands import (
        backup,
        bench,
        client,
        cluster,
        dev,
        feed,
        inspect,
        recovery,
        retention,
        server,
        sim,
        smoke,
        spark,
        storage,
        top,
        zk,
    )

    app.command("tail")(feed.tail)
    app.command("append")(feed.append)
    app.command("create-cluster")(zk.create_cluster)
    app.command("recover")(recovery.recover)
    app.command("truncate")(recovery.truncate)
    app.command("top")(top.top)
    app.command("smoke")(smoke.smoke)
    app.command("sim")(sim.sim)
    app.add_typer(inspect.app, name="inspect")
    app.add_typer(zk.app, name="zk")
    app.add_typer(storage.app, name="storage")
    app.add_typer(server.app, name="server")
    app.add_typer(cluster.app, name="cluster")
    app.add_typer(client.app, name="client")
    app.add_typer(dev.app, name="dev")
    app.add_typer(retention.app, name="retention")
    app.add_typer(spark.app, name="spark")
    app.add_typer(bench.app, name="bench")
    app.add_typer(backup.app, name="backup")


_register()


def main() -> None:
    # From here on a Ctrl-C is Python's KeyboardInterrupt again: WaltzGroup turns it into one line.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    app(prog_name="waltz")


if __name__ == "__main__":
    main()
