"""Rendering shared by every command: one console, JSON for scripts, one-line errors."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from waltz_engine.common.errors import WaltzError, without_java_class

# A pipe or file gets whole lines: rich would otherwise fold everything at 80 columns.
PIPE_WIDTH_COLUMNS = 100_000


class _Console(Console):
    """rich's Console, but a closed pipe is a BrokenPipeError (an exit 0, see :func:`closed_pipe`),
    where rich would exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("stdout closed")


console = _Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH_COLUMNS)
err_console = _Console(
    stderr=True, highlight=False, width=None if sys.stderr.isatty() else PIPE_WIDTH_COLUMNS
)

USAGE_ERROR = 2  # click's exit code for a bad command line; a failed operation exits 1

P = ParamSpec("P")
R = TypeVar("R")


_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SIZE_STEP = 1024


def human_size(size_bytes: int) -> str:
    """A size for people (tables and text): ``137801`` → ``134.6 KiB``; --json keeps exact bytes."""
    value = float(size_bytes)
    for unit in _SIZE_UNITS:
        if abs(value) < _SIZE_STEP or unit == _SIZE_UNITS[-1]:
            return f"{size_bytes} B" if unit == _SIZE_UNITS[0] else f"{value:.1f} {unit}"
        value /= _SIZE_STEP
    raise AssertionError("unreachable: the last unit always returns")


def print_json(value: Any) -> None:
    """One JSON document on stdout, stable key order as given."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr as one line; the command goes on."""
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True, markup=True, emoji=False)


def note(message: str) -> None:
    """Print ``note: message`` on stderr as one line: something worth knowing, nothing wrong."""
    err_console.print(f"note: {escape(message)}", soft_wrap=True, markup=True, emoji=False)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr as one line and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, markup=True, emoji=False)
    raise typer.Exit(code)


def usage_error(message: str) -> NoReturn:
    """The command line itself is wrong: ``error: message`` as one line, exit 2 (click's convention)."""
    fail(message, USAGE_ERROR)


def closed_pipe() -> NoReturn:
    """The reader of stdout went away (`waltz tail | head`): the output ends there, exit 0.

    stdout is pointed at /dev/null so that the interpreter's flush at exit cannot fail again
    (that would print "Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise typer.Exit(0)


def progress_bar(quiet: bool, *extra: ProgressColumn) -> Progress:
    """A transient progress display on stderr (description, bar, done/total, ``extra``, elapsed),
    shown only when stderr is a terminal and not ``quiet`` (--json)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra,
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    )


@contextmanager
def counting_progress(description: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """One :func:`progress_bar` line; yields its update callback ``(done, total)``."""
    with progress_bar(quiet) as progress:
        task = progress.add_task(description, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn expected errors (WaltzError, OSError) into a one-line message and exit 1."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except WaltzError as e:
            # A storage node's failure reads without the Java class name its wire carries.
            fail(without_java_class(str(e)))
        except BrokenPipeError:
            closed_pipe()
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            fail(f"{where}{e.strerror or e}")

    return wrapper
