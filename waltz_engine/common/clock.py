"""Where the library reads the time: the running event loop's clock, so a simulator's loop
with virtual time (``waltz_engine.sim.loop.SimLoop``) is the clock of all the code it runs.

Monotonic time is the running loop's ``time()`` (asyncio's default loops read
``time.monotonic()``, so off the simulator nothing changes); off any loop (a disk thread, a
ZooKeeper callback thread) it is ``time.monotonic()`` itself. Wall-clock time, for timestamps
written to disk and shown to people, is the loop's ``wall_time_ns()`` where the loop has one
(the simulator's), else ``time.time_ns()``.
"""

from __future__ import annotations

import asyncio
import time

# asyncio's own look-up of the running loop (None off a loop): off a loop (a storage node's disk
# threads read the clock for every append's metrics) ``get_running_loop`` raises, and a raise
# and catch costs more than the read itself.
_running_loop = asyncio._get_running_loop


# asyncio's own loops' clock: ``time.monotonic()`` (their ``time()`` is that, one call more; the
# server reads the clock about eight times per lone commit). A loop with a clock of its own (the
# simulator's virtual time) is asked. (uvloop's is CLOCK_MONOTONIC too, libuv's, read once per
# iteration: ``time.monotonic()`` agrees with it.)
_ASYNCIO_LOOP_TIME = asyncio.BaseEventLoop.time


# Loops with a clock of their own (the simulator's) not closed yet in this process. While there is
# none, every loop's clock is ``time.monotonic()``, read without looking the running loop up: in
# CPython 3.11 that look-up makes a ``getpid()`` system call (to notice a fork), about 0.8 us
# here, and a server read the clock about six times per commit.
_own_clock_loops = 0


def own_clock_loop_opened() -> None:
    """A loop whose ``time()`` is not ``time.monotonic()`` was made (:class:`SimLoop`)."""
    global _own_clock_loops
    _own_clock_loops += 1


def own_clock_loop_closed() -> None:
    """The loop :func:`own_clock_loop_opened` told of was closed (once)."""
    global _own_clock_loops
    assert _own_clock_loops > 0, "a loop with a clock of its own closed twice"
    _own_clock_loops -= 1


def monotonic_s() -> float:
    """Seconds of the running loop's clock (``time.monotonic()`` off a loop)."""
    if not _own_clock_loops:
        return time.monotonic()
    loop = _running_loop()
    if loop is None or type(loop).time is _ASYNCIO_LOOP_TIME:
        return time.monotonic()
    return loop.time()


def monotonic_ns() -> int:
    """:func:`monotonic_s` in integer nanoseconds."""
    loop = _running_loop()
    return time.monotonic_ns() if loop is None else round(loop.time() * 1e9)


def wall_ns() -> int:
    """Nanoseconds since the epoch: the simulator's virtual wall clock on its loop, else the real one."""
    loop = _running_loop()
    if loop is None:
        return time.time_ns()
    wall_time_ns = getattr(loop, "wall_time_ns", None)
    return time.time_ns() if wall_time_ns is None else int(wall_time_ns())


def wall_ms() -> int:
    """Milliseconds since the epoch, as Java's ``System.currentTimeMillis()``."""
    return wall_ns() // 1_000_000
