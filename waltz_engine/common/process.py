"""Running a node as a process: logging, signals, and one-line startup errors.

Shared by `waltz storage start` and `waltz server start`: serve until SIGTERM or SIGINT,
stop cleanly (exit 0), or fail at start-up with one line on stderr (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import setproctitle

from waltz_engine.common.errors import WaltzError
from waltz_engine.common.profiling import run_profiled

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")

C = TypeVar("C")


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class FailsWhileServing(Protocol):
    """A service that may stop serving by itself (a storage node that finds, once ZooKeeper
    answers, that its disk belongs to another cluster): its process exits 1."""

    async def failed(self) -> WaltzError: ...


def configure_logging(log_level: str) -> None:
    level = log_level.strip().upper()
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    logging.basicConfig(stream=sys.stderr, level=level, format=LOG_FORMAT)


def print_error(error: BaseException) -> None:
    """One line on stderr: what went wrong, never a traceback."""
    if isinstance(error, OSError) and not isinstance(error, WaltzError):
        where = f"{error.filename}: " if error.filename else ""
        text = f"{where}{error.strerror or error}"
    else:
        text = str(error)
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()


async def serve_until_signalled(service: Service, freeze_heap: bool = False) -> int:
    """Serve until SIGTERM or SIGINT. ``freeze_heap``: once started, what the process holds
    (modules, configuration, connections) is moved out of the garbage collector's sight
    (``gc.freeze``), so that its collections, made often by a busy node's short-lived objects,
    no longer walk it (a server at 16 active partitions spent about 4 % of its CPU in them, 1.6 %
    after). The price: a cycle among those objects that is dropped later (a storage connection
    at its first reconnect, a start-up partition once moved away: its feed blocks, up to about
    576 KiB a codec version, and its store session) is never freed, and neither is what it holds
    when dropped, even objects made after the freeze; once per object alive at the freeze."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await service.start()
    except (WaltzError, OSError) as e:
        await service.stop()
        print_error(e)
        return 1
    if freeze_heap:
        gc.collect()  # (what is garbage already is not kept for good)
        gc.freeze()
    waits: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
    if isinstance(service, FailsWhileServing):
        waits.append(asyncio.create_task(service.failed()))
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    results = [t.result() for t in done]
    failure = next((r for r in results if isinstance(r, WaltzError)), None)
    if failure is None:
        log.info("stopping on signal")
    await service.stop()
    if failure is not None:
        print_error(failure)
        return 1
    return 0


def run_service(
    load_config: Callable[[], C],
    make_service: Callable[[C], Service],
    log_level: str,
    title: str,
    freeze_heap: bool = False,
) -> int:
    """Configure logging, load the config, serve until signalled; the process's exit code.

    ``title`` is what `ps` and `top` show for the process (else `python -c ...`); ``freeze_heap``:
    see :func:`serve_until_signalled`.
    """
    setproctitle.setproctitle(title)
    try:
        configure_logging(log_level)
        config = load_config()
    except (ValueError, WaltzError) as e:
        print_error(e)
        return 1
    return asyncio.run(serve_until_signalled(make_service(config), freeze_heap))


def node_main(kind: str, run: Callable[[Path, str], int]) -> None:
    """``python -m waltz_engine.<kind> --config FILE [--log-level L]``: the entry point that
    ``waltz <kind> start`` and the dev cluster start nodes through."""
    parser = argparse.ArgumentParser(prog=f"python -m waltz_engine.{kind}", description=f"Run a {kind} node.")
    parser.add_argument("--config", "-c", type=Path, required=True, help=f"the {kind} node's YAML")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    args = parser.parse_args()
    sys.exit(run_profiled(kind, lambda: run(args.config, args.log_level)))
