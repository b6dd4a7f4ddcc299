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
# simulator's virtual time, uvloop's) is asked.
_ASYNCIO_LOOP_TIME = asyncio.BaseEventLoop.time


def monotonic_s() -> float:
    """Seconds of the running loop's clock (``time.monotonic()`` off a loop)."""
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
