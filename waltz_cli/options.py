"""One grammar for every command: the shared options, the short-flag glossary and hidden aliases.

The rules every command follows are in docs/cli.md (READ IT before changing a command).

Every command that talks to a cluster takes the same ``-c/--config``, ``-z/--zookeeper`` and
``-r/--cluster-root`` (also read from ``WALTZ_CONFIG``, ``WALTZ_ZOOKEEPER`` and
``WALTZ_CLUSTER_ROOT``); without any of them the local dev cluster's ``client.yml`` is used.
A short flag has one meaning across the whole tree (:data:`SHORT_FLAGS`; a test walks the tree
and checks it). The original's multi-letter single-dash flags (``-sp``, ``-tpc``, ``-sssl``) and
a few old long names keep working as hidden aliases (:data:`ALIASES`): they are rewritten to
the canonical flag before parsing and never shown in ``--help``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import typer.rich_utils
from rich.markup import escape
from typer.core import TyperGroup, TyperOption

from waltz_cli import INTERRUPTED_EXIT
from waltz_cli.output import closed_pipe, err_console, fail, usage_error
from waltz_engine.zk.partition_ranges import PartitionRangeError, parse_partition_ranges

# The one meaning of each short flag (short → canonical long name).
SHORT_FLAGS: dict[str, str] = {
    "-a": "--admin-port",
    "-b": "--batch-size",
    "-c": "--config",
    "-d": "--dir",
    "-f": "--force",
    "-g": "--group",
    "-h": "--help",
    "-i": "--interval-ms",
    "-l": "--lock-pool",
    "-m": "--master",
    "-n": "--name",
    "-o": "--output",
    "-p": "--partition",
    "-r": "--cluster-root",
    "-s": "--storage",
    "-t": "--transaction",
    "-z": "--zookeeper",
}

# Hidden aliases: the original's multi-letter single-dash flags and renamed long flags → the
# canonical flag. An alias is rewritten only for a command that has the canonical flag.
ALIASES: dict[str, str] = {
    "--cli-config-path": "--config",
    "-sp": "--storage-port",
    "-dp": "--destination-storage-port",
    "-sssl": "--source-ssl-config-path",
    "-dssl": "--destination-ssl-config-path",
    "-tpc": "--txn-per-client",
    "-nc": "--num-clients",
    "-ap": "--num-active-partitions",
    "-ml": "--mount-from-latest",
    "--interval": "--interval-ms",
    "--data-dir": "--dir",
    "--storage-admin-port": "--admin-port",
    "--source-storage": "--storage",
    "--limit": "--max",
    "--seconds": "--duration-s",
    "--duration": "--duration-s",
}

ENV_CONFIG = "WALTZ_CONFIG"
ENV_ZOOKEEPER = "WALTZ_ZOOKEEPER"
ENV_CLUSTER_ROOT = "WALTZ_CLUSTER_ROOT"

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

_display_type_rich = TyperOption.display_type_rich


def _no_placeholder_on_switches(self: TyperOption, ctx: Any) -> str | None:
    """A switch takes no value: typer >= 0.29 shows ``<bool>`` beside it, which reads as one."""
    return None if self.is_flag else _display_type_rich(self, ctx)


TyperOption.display_type_rich = _no_placeholder_on_switches  # type: ignore[method-assign]


def _one_line_usage_error(error: Any) -> None:  # typer's own (vendored) click.ClickException
    """A usage error (bad value, unknown flag) as one line on stderr, not typer's boxed panel."""
    if type(error).__name__ == "NoArgsIsHelpError":  # typer printed the help already
        return
    ctx = getattr(error, "ctx", None)
    hint = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
    message = " ".join(error.format_message().split())
    err_console.print(f"[bold red]error:[/] {escape(message)}{escape(hint)}", soft_wrap=True, emoji=False)


typer.rich_utils.rich_format_error = _one_line_usage_error  # type: ignore[assignment]


def _rewrite_aliases(command: Any, args: list[str]) -> list[str]:
    """The command's args with hidden aliases replaced by the canonical flags it has."""
    own = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    rewritten: list[str] = []
    for index, arg in enumerate(args):
        if arg == "--":  # everything after is data, never a flag
            return rewritten + args[index:]
        name, eq, value = arg.partition("=")
        target = ALIASES.get(name)
        rewritten.append(f"{target}{eq}{value}" if target in own and name not in own else arg)
    return rewritten


class WaltzGroup(TyperGroup):
    """A command group that understands the hidden aliases of :data:`ALIASES`, ends a command
    whose reader went away (`waltz zk list | head -1`) quietly with exit 0 (click's own handling
    exits 1), and a Ctrl-C that the command did not handle as one line with exit 130."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            closed_pipe()
        except KeyboardInterrupt:  # click would print "Aborted!" and exit 1
            fail("interrupted", INTERRUPTED_EXIT)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, TyperGroup):
            rest = _rewrite_aliases(command, rest)
        return name, command, rest


def group(help: str) -> typer.Typer:
    """A ``waltz`` command group: ``-h`` for help, hidden aliases, help when run bare."""
    return typer.Typer(cls=WaltzGroup, help=help, no_args_is_help=True, context_settings=CONTEXT_SETTINGS)


# --- where the cluster is -----------------------------------------------------------------------

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar=ENV_CONFIG,
        help="YAML with the original's keys (zookeeper.connectString, cluster.root, ssl.*); "
        "default: .waltz-dev/client.yml of a local dev cluster.",
    ),
]
ZooKeeperOption = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        "-z",
        envvar=ENV_ZOOKEEPER,
        help="ZooKeeper connect string HOST:PORT[,HOST:PORT...] (overrides --config).",
    ),
]
RootOption = Annotated[
    str | None,
    typer.Option(
        "--cluster-root",
        "-r",
        envvar=ENV_CLUSTER_ROOT,
        help="Cluster root znode, e.g. /waltz (overrides --config).",
    ),
]
ClientTimeoutOption = Annotated[
    int,
    typer.Option(
        "--timeout-ms", min=1, help="Give up on an unreachable ZooKeeper or server after this long."
    ),
]
ConnectTimeoutOption = Annotated[
    int | None,
    typer.Option(
        "--connect-timeout-ms", min=1, help="Give up connecting to ZooKeeper after this long (default 10000)."
    ),
]

# --- what to print ------------------------------------------------------------------------------

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (snake_case keys) instead of text.")]

# --- what to act on -----------------------------------------------------------------------------


def one_partition(text: str) -> int:
    """A single partition id; a list or range is a usage error (exit 2) saying so in one line."""
    if not text.strip().isdigit():
        raise typer.BadParameter(
            f"'{text}' is not one partition id: this command acts on one partition (e.g. -p 3)"
        )
    return int(text)


def partition_ranges(text: str) -> str:
    """Partition ids and ranges, checked while parsing so that a bad one is a usage error (exit 2)."""
    try:
        parse_partition_ranges(text)
    except PartitionRangeError as e:
        raise typer.BadParameter(str(e)) from None
    return text


PartitionOption = Annotated[
    int, typer.Option("--partition", "-p", parser=one_partition, metavar="ID", help="One partition id.")
]
PartitionsOption = Annotated[
    str,
    typer.Option(
        "--partition",
        "-p",
        parser=partition_ranges,
        metavar="IDS",
        help="Partition ids and ranges, e.g. 0-6,7,10-16.",
    ),
]
OptionalPartitionsOption = Annotated[
    str | None,
    typer.Option(
        "--partition",
        "-p",
        parser=partition_ranges,
        metavar="IDS",
        help="Partition ids and ranges, e.g. 0 or 0,2-3.",
    ),
]
AllPartitionsOption = Annotated[bool, typer.Option("--all", help="Every partition of the cluster.")]


def chosen_partitions(partition: str | None, every: bool) -> list[int] | None:
    """The partitions of ``-p`` or ``--all`` (None: every partition); neither or both is a usage error."""
    if every and partition is not None:
        usage_error("give -p/--partition or --all, not both")
    if every:
        return None
    if partition is None:
        usage_error("which partitions? give -p/--partition (e.g. -p 0 or -p 0,2-3) or --all")
    return parse_partition_ranges(partition)


StorageOption = Annotated[
    str,
    typer.Option(
        "--storage",
        "-s",
        help="A storage node, HOST:PORT (its data port as registered, or its admin port).",
    ),
]
TransactionOption = Annotated[
    int | None, typer.Option("--transaction", "-t", min=0, help="One transaction id.")
]
DirOption = Annotated[Path, typer.Option("--dir", "-d", help="Working directory.")]
SslConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--ssl-config",
        help="YAML with server.ssl.keyStore.* / server.ssl.trustStore.* for the TLS connections "
        "to storage nodes (default: no certificate checks, as the original).",
    ),
]
