"""Run a `waltz` command to completion in its own process, forked from a warm parent.

A cold `python -m waltz_cli ...` spends 0.7-1 s of CPU importing the CLI and the engine, and the
suite runs a few hundred commands. A zygote process (one per test worker) imports them once and
forks a child per command. Each child is still a process of its own: its pid, working directory,
environment, stdin, stdout, stderr and exit status, with the `waltz` script's ``main()`` running
in it and Python's own exit path (atexit handlers, non-daemon threads joined). What differs from
a cold start is only the imports it skips, so tests of a cold start itself (what a command
imports, a Ctrl-C while it starts, the installed script, a venv without the extras) start a real
``subprocess``, as do commands that keep running while a test talks to them.

The zygote serves one command at a time (a test worker runs one test at a time): a JSON line in,
the child's pid and then its exit status out.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("waltz_cli", "waltz_engine")
# Modules whose import runs something (a node's `python -m`) or needs pytest.
_NOT_PRELOADED = ("__main__", "pytest_plugin")
# How long the zygote may take to import everything before a command gives up on it.
_ZYGOTE_START_TIMEOUT_S = 120.0
_STDIO_FLAGS = (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY)


def _modules() -> list[str]:
    """Every module of the CLI and the engine, by name, found without importing any."""
    names = []
    for package in _PACKAGES:
        for path in sorted((_ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(_ROOT).with_suffix("").parts)
            if parts[-1] in _NOT_PRELOADED:
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# --- the zygote ------------------------------------------------------------------------------


def _exit_code(error: SystemExit) -> int:
    """What Python's own exit makes of ``sys.exit(code)``."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _become_command(request: dict[str, Any], control: tuple[int, int]) -> None:
    """The child: `waltz ARGV...` started in ``cwd`` with ``env`` and the given stdio files."""
    for fd in control:
        os.close(fd)
    for fd, (path, flags) in enumerate(zip(request["stdio"], _STDIO_FLAGS, strict=True)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdio
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["waltz", *request["argv"]]
    code = 0
    try:
        from waltz_cli.main import main

        main()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        threading._shutdown()  # type: ignore[attr-defined] - Python's exit joins non-daemon threads
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The zygote's loop: import everything, then fork a child per request and report on it."""
    import importlib

    for name in _modules():
        importlib.import_module(name)
    # The requests and reports move off stdin/stdout, which each child replaces with its own.
    control = (os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    requests = os.fdopen(control[0], "r", encoding="utf-8")
    reports = os.fdopen(control[1], "w", encoding="utf-8", buffering=1)
    reports.write("ready\n")
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_command(request, control)
        reports.write(f"{pid}\n")
        _, status = os.waitpid(pid, 0)
        reports.write(f"{os.waitstatus_to_exitcode(status)}\n")


# --- the test's side ---------------------------------------------------------------------------


class _Zygote:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=_ROOT,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests: IO[str] = self.process.stdin
        self.reports: IO[str] = self.process.stdout
        assert self.read_line(_ZYGOTE_START_TIMEOUT_S) == "ready"

    def read_line(self, timeout_s: float) -> str | None:
        """The next report line, or None when ``timeout_s`` passed first."""
        ready, _, _ = select.select([self.reports], [], [], timeout_s)
        if not ready:
            return None
        line = self.reports.readline()
        if not line:
            raise RuntimeError(f"the CLI zygote exited with {self.process.wait()}")
        return line.strip()


_zygote: _Zygote | None = None


def _the_zygote() -> _Zygote:
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = _Zygote()
    return _zygote


def run_forked(
    command: Sequence[str],
    args: Sequence[str],
    *,
    cwd: Path | str | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
) -> subprocess.CompletedProcess[str]:
    """`waltz ARGS...` to completion, reported as ``subprocess.run(command, capture_output=True,
    text=True)`` would (``command`` only names it); ``env`` is the whole environment (None: this
    process's)."""
    zygote = _the_zygote()
    with tempfile.TemporaryDirectory(prefix="waltz-cli-") as scratch:
        stdio = [str(Path(scratch, name)) for name in ("stdin", "stdout", "stderr")]
        Path(stdio[0]).write_text(stdin or "", encoding="utf-8")
        Path(stdio[1]).touch()
        Path(stdio[2]).touch()
        request = {
            "argv": list(args),
            "cwd": None if cwd is None else str(Path(cwd).resolve()),
            "env": dict(os.environ if env is None else env),
            "stdio": stdio,
        }
        zygote.requests.write(json.dumps(request) + "\n")
        zygote.requests.flush()
        pid = int(zygote.read_line(_ZYGOTE_START_TIMEOUT_S) or "0")
        assert pid > 0, "the CLI zygote did not fork"
        status = zygote.read_line(timeout_s)
        timed_out = status is None
        if timed_out:
            os.kill(pid, signal.SIGKILL)
            status = zygote.read_line(_ZYGOTE_START_TIMEOUT_S)
        out = Path(stdio[1]).read_text(encoding="utf-8", errors="replace")
        err = Path(stdio[2]).read_text(encoding="utf-8", errors="replace")
    if timed_out:
        raise subprocess.TimeoutExpired(list(command), timeout_s, out, err)
    assert status is not None
    return subprocess.CompletedProcess(list(command), int(status), out, err)


if __name__ == "__main__":
    serve()
