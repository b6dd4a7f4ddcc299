"""Processes forked from a warm parent: `waltz` commands run to completion, and nodes.

A cold `python -m waltz_cli ...` spends 0.7-1 s of CPU importing the CLI and the engine, a cold
node 0.3-0.5 s, and the suite starts several hundred of each. A zygote process (one per test
worker) imports them once and forks a child per command or node. Each child is still a process
of its own: its pid, session, working directory, environment, stdin, stdout, stderr and exit
status, with the `waltz` script's ``main()`` or the node's ``python -m`` module running in it and
Python's own exit path (atexit handlers, non-daemon threads joined); a node sets its process title
as it does when started cold, so `ps` and the dev cluster's pid checks see the same. What differs
from a cold start is only the imports it skips, so tests of a cold start itself (what a command
imports, a Ctrl-C while it starts, the installed script, a venv without the extras) start a real
``subprocess``.

The zygote forks on request (one JSON line: the child's pid back) and reaps its children as they
exit (a line with the pid and its exit status); a thread of the test worker reads those lines.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import setproctitle

_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("waltz_cli", "waltz_engine")
# Modules whose import runs something (a node's `python -m`) or needs pytest.
_NOT_PRELOADED = ("__main__", "pytest_plugin")
# What is imported on first use, by every child that would pay for it: typer's parse of a command
# line (pydantic, for the options' types; 0.1-0.2 s of CPU per command), rich's help and tables,
# host name encoding, and a node's self-signed TLS pair (cryptography, 0.08 s).
_LAZY_IMPORTS = (
    "typer._adapters",
    "typer._click.decorators",
    "pydantic",
    "pydantic.plugin._loader",
    "rich.markdown",
    "rich._emoji_codes",
    "encodings.idna",
    "cryptography.x509",
    "cryptography.x509.oid",
    "cryptography.hazmat.primitives.asymmetric.ec",
    "cryptography.hazmat.primitives.hashes",
    "cryptography.hazmat.primitives.serialization",
)
# How long the zygote may take to import everything, or to answer a request, before a test gives up.
_ZYGOTE_ANSWER_TIMEOUT_S = 120.0
# How often a command with a stall bound is looked at (its process tree's CPU time).
_PROGRESS_POLL_S = 1.0
# Most bytes a request line may take (a command line and an environment).
_MAX_REQUEST_BYTES = 1 << 20
_READ_CHUNK_BYTES = 65_536
# A child's stdio: (path, open flags); None for stderr means "where stdout goes".
_OPEN_FLAGS = {
    "r": os.O_RDONLY,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


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


def _become(request: dict[str, Any]) -> None:
    """The child: the requested program, started in ``cwd`` with ``env`` and the given stdio."""
    for fd, (path, mode) in enumerate(request["stdio"]):
        if path is None:
            os.dup2(1, fd)
            continue
        opened = os.open(path, _OPEN_FLAGS[mode], 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the zygote's pipes and pidfds
    if request["new_session"]:
        os.setsid()
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdio
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    # The title first: setproctitle takes over the memory of the environment's strings only
    # while they are where the process started with them, before the environment is replaced.
    setproctitle.setproctitle(" ".join(request["title"]))
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        if request["module"] is None:
            sys.argv = ["waltz", *request["argv"]]
            from waltz_cli.main import main

            main()
        else:
            sys.argv = ["-m", *request["argv"]]  # run_module puts the module's path first
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        threading._shutdown()  # type: ignore[attr-defined]  # Python's exit joins non-daemon threads
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The zygote's loop: import everything, then fork a child per request and report its exit."""
    import importlib

    for name in [*_modules(), *_LAZY_IMPORTS]:
        importlib.import_module(name)
    # The requests and reports move off stdin/stdout, which each child replaces with its own.
    requests, reports = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    # A Ctrl-C on the suite reaches the whole process group: the zygote ends when its worker
    # closes the requests, so that it still reports the exits of what the worker stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.write(reports, b"ready\n")
    children: dict[int, int] = {}  # pidfd -> pid
    pending = b""
    while True:
        readable, _, _ = select.select([requests, *children], [], [])
        for fd in readable:
            if fd != requests:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                os.write(reports, f"exited {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
                continue
            chunk = os.read(requests, _READ_CHUNK_BYTES)
            if not chunk:
                return
            pending += chunk
            assert len(pending) <= _MAX_REQUEST_BYTES, "request line too long"
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become(request)
                children[os.pidfd_open(pid)] = pid
                os.write(reports, f"started {pid}\n".encode())


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
        self._requests: IO[str] = self.process.stdin
        self._reports: IO[str] = self.process.stdout
        self._request_lock = threading.Lock()  # a request and its "started" line, one at a time
        self._started: queue.Queue[int] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._exited = threading.Condition()
        self.alive = True
        ready, _, _ = select.select([self._reports], [], [], _ZYGOTE_ANSWER_TIMEOUT_S)
        assert ready and self._reports.readline().strip() == "ready", "the zygote did not start"
        threading.Thread(target=self._read_reports, name="zygote-reports", daemon=True).start()

    def _read_reports(self) -> None:
        for line in self._reports:
            kind, *fields = line.split()
            if kind == "started":
                pid = int(fields[0])
                with self._exited:
                    # A pid the kernel hands out again: the earlier child's status is not this one's
                    # (the zygote reports an exit before it can fork a child that reuses the pid).
                    self._exits.pop(pid, None)
                self._started.put(pid)
            else:
                with self._exited:
                    self._exits[int(fields[0])] = int(fields[1])
                    self._exited.notify_all()
        with self._exited:
            self.alive = False
            self._exited.notify_all()
        self._started.put(0)

    def start(self, request: dict[str, Any]) -> int:
        """Forks a child; its pid."""
        with self._request_lock:
            self._requests.write(json.dumps(request) + "\n")
            self._requests.flush()
            pid = self._started.get(timeout=_ZYGOTE_ANSWER_TIMEOUT_S)
        if pid <= 0:
            raise RuntimeError(f"the zygote exited with {self.process.wait()}")
        return pid

    def wait(self, pid: int, timeout_s: float | None) -> int | None:
        """The child's exit status once it has exited, waiting up to ``timeout_s``; else None."""
        with self._exited:
            self._exited.wait_for(lambda: pid in self._exits or not self.alive, timeout_s)
            if pid not in self._exits and not self.alive:
                raise RuntimeError(f"the zygote exited with {self.process.wait()}: pid {pid} is lost")
            return self._exits.get(pid)


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _the_zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive:
            _zygote = _Zygote()
        return _zygote


class ForkedProcess:
    """A child of the zygote, used as a ``subprocess.Popen`` is (what the tests and the dev
    cluster's :data:`~waltz_engine.ops.devcluster.nodes.NodeLauncher` use of it)."""

    def __init__(self, zygote: _Zygote, pid: int, args: Sequence[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, timeout)
            if self.returncode is None:
                assert timeout is not None
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_forked(
    module: str | None,
    args: Sequence[str],
    *,
    stdio: Sequence[tuple[str | None, str]],
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> ForkedProcess:
    """`python -m MODULE ARGS...` (``module`` None: `waltz ARGS...`) forked from the zygote.

    ``stdio``: (path, "r"/"w"/"a") for stdin, stdout and stderr; a None path for stderr sends it
    where stdout goes. ``env`` is the whole environment (None: this process's).
    """
    assert len(stdio) == 3 and stdio[0][0] is not None and stdio[1][0] is not None
    for path, mode in stdio:
        if path is not None and mode != "r":
            Path(path).touch()  # there once started, as with subprocess.Popen
    zygote = _the_zygote()
    title = [*(["python", "-m", module] if module is not None else ["waltz"]), *args]
    request = {
        "module": module,
        "argv": list(args),
        "cwd": None if cwd is None else str(Path(cwd).resolve()),
        "env": dict(os.environ if env is None else env),
        "stdio": [list(entry) for entry in stdio],
        "new_session": new_session,
        "title": title,
    }
    return ForkedProcess(zygote, zygote.start(request), title)


def launch_forked_node(module: str, args: Sequence[str], cwd: Path, log_path: Path) -> ForkedProcess:
    """The dev cluster's :data:`~waltz_engine.ops.devcluster.nodes.NodeLauncher`, forked."""
    return start_forked(
        module, args, stdio=[(os.devnull, "r"), (str(log_path), "a"), (None, "a")], cwd=cwd, new_session=True
    )


def run_forked(
    command: Sequence[str],
    args: Sequence[str],
    *,
    cwd: Path | str | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    stall_s: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """`waltz ARGS...` to completion, reported as ``subprocess.run(command, capture_output=True,
    text=True)`` would (``command`` only names it); ``env`` is the whole environment (None: this
    process's). ``timeout_s`` bounds the whole run; with ``stall_s``, it is given up on sooner
    once nothing of it (its process tree: a Spark JVM too) has run for that long (see
    :func:`wait_while_working`)."""
    with tempfile.TemporaryDirectory(prefix="waltz-cli-") as scratch:
        paths = [str(Path(scratch, name)) for name in ("stdin", "stdout", "stderr")]
        Path(paths[0]).write_text(stdin or "", encoding="utf-8")
        child = start_forked(
            None, args, stdio=[(paths[0], "r"), (paths[1], "w"), (paths[2], "w")], cwd=cwd, env=env
        )
        waited_s: float | None = None
        try:
            status = wait_while_working(child, timeout_s, stall_s)
        except subprocess.TimeoutExpired as e:
            child.kill()
            status = child.wait(_ZYGOTE_ANSWER_TIMEOUT_S)
            waited_s = e.timeout
        out = Path(paths[1]).read_text(encoding="utf-8", errors="replace")
        err = Path(paths[2]).read_text(encoding="utf-8", errors="replace")
    if waited_s is not None:
        raise subprocess.TimeoutExpired(list(command), waited_s, out, err)
    return subprocess.CompletedProcess(list(command), status, out, err)


def wait_while_working(child: ForkedProcess, timeout_s: float, stall_s: float | None = None) -> int:
    """``child.wait(timeout_s)``; with ``stall_s``, a wait on progress: the child's exit status,
    or TimeoutExpired (its ``timeout`` the seconds waited) once ``timeout_s`` have passed, or
    ``stall_s`` in which the CPU time of the child's process tree did not move. A loaded machine
    slows a command down but does not stop it (a Spark export had 9 % of a core at a load of
    19-31 and took over 120 s); one that waits for what never comes runs nothing."""
    if stall_s is None:
        return child.wait(timeout_s)
    started_s = moved_s = time.monotonic()
    seen = -1
    while True:
        now_s = time.monotonic()
        ticks = tree_cpu_ticks(child.pid)
        if ticks != seen:  # (it drops only when a process leaves the tree: work too)
            seen, moved_s = ticks, now_s
        left_s = min(started_s + timeout_s, moved_s + stall_s) - now_s
        if left_s <= 0:
            raise subprocess.TimeoutExpired(child.args, now_s - started_s)
        try:
            return child.wait(min(left_s, _PROGRESS_POLL_S))
        except subprocess.TimeoutExpired:
            continue


def tree_cpu_ticks(pid: int) -> int:
    """The CPU time of process ``pid`` and its descendants, in clock ticks: what each ran and
    what its reaped children ran (Linux's /proc); 0 once it is gone."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # it exited meanwhile
        # After "pid (command) ": state ppid ... utime stime cutime cstime (fields 4 and 14-17).
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = sum(int(field) for field in fields[11:15])
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    total, stack = 0, [pid] if pid in ticks else []
    while stack:
        process = stack.pop()
        total += ticks[process]
        stack.extend(children.get(process, []))
    return total


if __name__ == "__main__":
    serve()
