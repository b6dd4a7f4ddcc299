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

import functools
import importlib.util
import inspect
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, overload

import typer
from rich.markup import escape
from typer.core import TyperGroup, TyperOption

from waltz_cli import INTERRUPTED_EXIT
from waltz_cli.output import closed_pipe, err_console, fail, usage_error
from waltz_engine.ops.tool_config import load_settings
from waltz_engine.zk.connection import ZooKeeperSettings
from waltz_engine.zk.partition_ranges import PartitionRangeError, parse_partition_ranges

if TYPE_CHECKING:
    from waltz_engine.client import WaltzClientConfig
    from waltz_engine.net.tls import TlsConfig

R = TypeVar("R")
# The one default of --timeout-ms: every wait of a cluster command (ZooKeeper, servers, storage).
DEFAULT_TIMEOUT_MS = 10_000

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
    "-sssl": "--source-ssl-config",
    "--source-ssl-config-path": "--source-ssl-config",
    "-dssl": "--destination-ssl-config",
    "--destination-ssl-config-path": "--destination-ssl-config",
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
    "--connect-timeout-ms": "--timeout-ms",
    "--wait-timeout-ms": "--timeout-ms",
}

ENV_CONFIG = "WALTZ_CONFIG"
ENV_ZOOKEEPER = "WALTZ_ZOOKEEPER"
ENV_CLUSTER_ROOT = "WALTZ_CLUSTER_ROOT"

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

_display_type_rich = TyperOption.display_type_rich


def _short_placeholder(self: TyperOption, ctx: Any) -> str | None:
    """None for a switch (it takes no value: typer >= 0.29 shows ``<bool>``, which reads as one),
    and ``<int>`` for a ranged number: typer's ``<int range> [x>=1]`` takes the columns the option
    names and their help need at 80 columns (the range is still checked, with a one-line error)."""
    if self.is_flag:
        return None
    if self.type_descriptor.is_ranged:
        return f"<{self.type_descriptor.ranged_type_name}>"
    return _display_type_rich(self, ctx)


TyperOption.display_type_rich = _short_placeholder  # type: ignore[method-assign]


def _one_line_usage_error(error: Any) -> None:  # typer's own (vendored) click.ClickException
    """A usage error (bad value, unknown flag) as one line on stderr, not typer's boxed panel."""
    if type(error).__name__ == "NoArgsIsHelpError":  # typer printed the help already
        return
    ctx = getattr(error, "ctx", None)
    hint = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
    message = " ".join(error.format_message().split())
    err_console.print(f"[bold red]error:[/] {escape(message)}{escape(hint)}", soft_wrap=True, emoji=False)


def _patch_lazily(name: str, **patches: Any) -> None:
    """Set attributes of module ``name`` without importing it now: typer.rich_utils (help panels,
    with rich.markdown, markdown-it and pygments) is about a third of a command's start-up, and
    only ``--help`` and usage errors load it. The patches outlive its load (``LazyLoader`` keeps
    attributes set before it)."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None, name
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        package, _, attribute = name.rpartition(".")
        setattr(sys.modules[package], attribute, module)
    for key, value in patches.items():
        setattr(module, key, value)


# RANGE_STRING: see _short_placeholder.
_patch_lazily("typer.rich_utils", RANGE_STRING="", rich_format_error=_one_line_usage_error)


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

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help:
            command.help = unwrap_help(command.help)
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, TyperGroup):
            rest = _rewrite_aliases(command, rest)
        return name, command, rest


# A help line starting so begins a line of its own; every other line break in a paragraph goes.
_OWN_LINE_PREFIXES = ("Example", "- ", "* ", "• ", " ", "$ ")


def unwrap_help(text: str) -> str:
    """A docstring's paragraphs as single lines, so the terminal wraps them once.

    Docstrings are wrapped in the source at the code's width; typer keeps those line breaks past
    the first paragraph and rich wraps the lines again at the terminal's width: ragged text
    ("wrapped twice"). Examples, list items and indented lines keep their own lines.
    """
    paragraphs = inspect.cleandoc(text).split("\n\n")
    joined = []
    for paragraph in paragraphs:
        if paragraph.startswith("\b"):  # click's "do not rewrap" marker
            joined.append(paragraph)
            continue
        lines = paragraph.split("\n")
        out = [lines[0]]
        for line in lines[1:]:
            if line.startswith(_OWN_LINE_PREFIXES):
                out.append(line)
            else:
                out[-1] = f"{out[-1]} {line.strip()}"
        joined.append("\n".join(out))
    return "\n\n".join(joined)


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


TimeoutMsOption = Annotated[
    int,
    typer.Option(
        "--timeout-ms",
        min=1,
        help="Give up on ZooKeeper, a server or a storage node that does not answer in this long.",
    ),
]


@dataclass(frozen=True)
class Cluster:
    """The options every cluster command shares (declared once, by :func:`cluster_command`):
    where the cluster is and how long to wait for any part of it."""

    config: Path | None = None
    zookeeper: str | None = None
    cluster_root: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def settings(self) -> ZooKeeperSettings:
        """ZooKeeper's address, root and connect timeout from the flags, else the config file."""
        return load_settings(self.config, self.zookeeper, self.cluster_root, self.timeout_ms)

    def tls_config(self, ssl_config: Path | None = None) -> TlsConfig:
        """TLS to servers and storage nodes: ``--ssl-config``'s ``server.ssl.*`` keys when given,
        else the ``ssl.*`` keys of ``--config``, as the original's tools read them."""
        from waltz_engine.ops.cluster_ops import tools_tls_config
        from waltz_engine.storage.admin_ops import client_tls_config

        return client_tls_config(ssl_config) if ssl_config is not None else tools_tls_config(self.config)

    def tls_context(self, ssl_config: Path | None = None) -> ssl.SSLContext:
        """:meth:`tls_config` as a context."""
        from waltz_engine.net.tls import client_context

        return client_context(self.tls_config(ssl_config))

    def client_config(self) -> WaltzClientConfig:
        """A client's config for the cluster, every wait bounded by the timeout."""
        from waltz_engine.ops.client_tools import load_client_config  # the client only where used

        return load_client_config(
            self.config, zookeeper=self.zookeeper, cluster_root=self.cluster_root, timeout_ms=self.timeout_ms
        )


# The default a command's ``cluster`` parameter declares; :func:`cluster_command` always passes
# the one the options make.
FROM_OPTIONS = Cluster()
_CLUSTER_PARAMETER = "cluster"
_CLUSTER_OPTIONS = (("config", ConfigOption), ("zookeeper", ZooKeeperOption), ("cluster_root", RootOption))


@overload
def cluster_command(func: Callable[..., R]) -> Callable[..., R]: ...


@overload
def cluster_command(*, default_timeout_ms: int) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def cluster_command(
    func: Callable[..., R] | None = None, *, default_timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> Any:
    """Give a command the shared cluster options: its ``cluster: Cluster`` parameter becomes
    ``-c/-z/-r/--timeout-ms`` on the command line, and one :class:`Cluster` in the call.
    ``@cluster_command``, or ``@cluster_command(default_timeout_ms=...)`` for a longer wait."""

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        kept = [p for name, p in signature.parameters.items() if name != _CLUSTER_PARAMETER]
        keyword = inspect.Parameter.KEYWORD_ONLY
        added = [inspect.Parameter(name, keyword, default=None, annotation=a) for name, a in _CLUSTER_OPTIONS]
        added.append(
            inspect.Parameter("timeout_ms", keyword, default=default_timeout_ms, annotation=TimeoutMsOption)
        )

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            given = {p.name: kwargs.pop(p.name) for p in added}
            return command(*args, cluster=Cluster(**given), **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in (*kept, *added)}
        return wrapper

    return decorate if func is None else decorate(func)


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
