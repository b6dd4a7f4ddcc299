"""An asyncio event loop whose time is virtual: a simulated run is a pure function of its seed.

:class:`SimLoop` is asyncio's own loop (``BaseEventLoop``: its ready queue, timers, tasks and
futures, FIFO order) with a selector that never blocks: when nothing is ready, time jumps to
the next timer, so ``asyncio.sleep(3600)`` costs no real time. There is no I/O to wait for;
the simulated network, disk and ZooKeeper schedule their events as callbacks. Executors are
replaced, not wrapped: ``run_in_executor`` (so ``asyncio.to_thread``) runs the function on the
loop, inline, at the next turn. Every random choice of a run comes from :attr:`SimLoop.rng`.

The loop keeps a trace: the events the simulated world records (:meth:`SimLoop.record`) and the
shape of every loop turn (its virtual time, how many callbacks were ready). A running hash of
it (:attr:`SimLoop.trace_hash`) tells two runs apart; the last events are kept in words for
the report of a failing seed.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import hashlib
import heapq
import random
import selectors
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from waltz_engine.common.errors import WaltzError

_T = TypeVar("_T")

# Virtual time starts here, not at zero: code that treats 0 as "never" sees a real-looking clock.
START_MONOTONIC_S = 10_000.0
# The virtual wall clock at START_MONOTONIC_S (2025-11-25T00:00:00Z), for timestamps on disk.
START_WALL_NS = 1_764_028_800 * 1_000_000_000
# The events kept in words for a failing seed's report.
TRACE_TAIL_EVENTS = 200
_TURN = struct.Struct("<dI")


class SimStalledError(WaltzError):
    """Nothing is ready and no timer is set, yet the run waits: the simulated world is stuck."""


class SimEvent(collections.namedtuple("SimEvent", "time_s kind detail")):
    """One recorded event of a run: its virtual time, a kind and a detail in words."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.time_s - START_MONOTONIC_S:12.6f}s {self.kind}: {self.detail}"


class _VirtualSelector(selectors.BaseSelector):
    """Never waits: a select with a timeout moves the loop's clock to its end."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        raise NotImplementedError("the simulator has no file descriptors to watch")

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        raise KeyError(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._loop._advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


def _describe(func: Callable[..., Any]) -> str:
    """A callable's name, through the partials asyncio.to_thread wraps it in (never an address)."""
    while isinstance(func, functools.partial):
        context_run = isinstance(getattr(func.func, "__self__", None), contextvars.Context)
        func = func.args[0] if context_run and func.args else func.func
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else str(name)


class _SimTimerHandle(asyncio.TimerHandle):
    """A timer ordered by its time, then by when it was set: two timers due at the same virtual
    time run in the order they were set, whatever the heap's shape (asyncio's own timers tie on
    time alone, and the heap's shape depends on cancellations, some made by the garbage
    collector at moments a seed does not decide)."""

    __slots__ = ("_sequence",)

    def __init__(
        self, when: float, callback: Any, args: Any, loop: SimLoop, context: Any, sequence: int
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._sequence = sequence

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _SimTimerHandle):
            return (self.when(), self._sequence) < (other.when(), other._sequence)
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, _SimTimerHandle):
            return (self.when(), self._sequence) <= (other.when(), other._sequence)
        return NotImplemented


class SimLoop(asyncio.BaseEventLoop):
    """asyncio's loop with virtual time, executors run inline, one seeded generator and a trace."""

    # BaseEventLoop's own state, which typeshed does not declare.
    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _check_closed: Callable[[], None]

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.rng = random.Random(seed)
        self._now = START_MONOTONIC_S
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9
        self._hash = hashlib.blake2b(digest_size=16)
        self._hash.update(struct.pack("<q", seed))
        self.events = 0
        self.tail: collections.deque[SimEvent] = collections.deque(maxlen=TRACE_TAIL_EVENTS)
        self._timers_set = 0

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """asyncio's ``call_at``, with timers that tie on time ordered by when they were set."""
        self._check_closed()
        self._timers_set += 1
        timer = _SimTimerHandle(when, callback, args, self, context, self._timers_set)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True  # type: ignore[attr-defined]  # (asyncio's own, undeclared)
        return timer

    # The clock.

    def time(self) -> float:
        return self._now

    def wall_time_ns(self) -> int:
        """The virtual wall clock (nanoseconds since the epoch), moving with :meth:`time`."""
        return START_WALL_NS + round((self._now - START_MONOTONIC_S) * 1e9)

    def _advance(self, timeout: float | None) -> None:
        ready = len(self._ready)
        if timeout is None:
            raise SimStalledError(
                f"the simulated world is stuck at {self._now - START_MONOTONIC_S:.6f} s: "
                "nothing is ready and no timer is set"
            )
        if timeout > 0:
            scheduled = self._scheduled
            # The next timer's own time, not now + timeout: a float sum could land a hair short.
            when = scheduled[0].when() if scheduled else self._now + timeout
            self._now = max(self._now, min(when, self._now + timeout))
        self._hash.update(_TURN.pack(self._now, ready))

    # The trace.

    def record(self, kind: str, detail: str) -> None:
        """Add an event of the simulated world to the trace (and to its hash)."""
        self.events += 1
        self.tail.append(SimEvent(self._now, kind, detail))
        self._hash.update(f"{self._now!r}|{kind}|{detail}\n".encode())

    @property
    def trace_hash(self) -> str:
        """The running hash of the trace so far, as hex."""
        return self._hash.hexdigest()

    # Executors, replaced: the function runs on the loop, at the next turn.

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., _T], *args: Any
    ) -> asyncio.Future[_T]:
        self._check_closed()
        future: asyncio.Future[_T] = self.create_future()
        name = _describe(func)

        def run() -> None:
            if future.cancelled():
                return
            self.record("exec", name)
            try:
                result = func(*args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(result)

        self.call_soon(run)
        return future

    def set_default_executor(self, executor: Any) -> None:
        raise NotImplementedError("the simulator runs executors' work on its loop; it has no executor")

    # No I/O: the selector loop's hooks have nothing to do.

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        # call_soon_threadsafe wakes a waiting selector; this one never waits.
        pass


class SimDiskRunner:
    """A storage node's disk passes (``DiskRunner``) on the loop: a pass's work runs at the next
    turn, its partitions' batches one after another, and its completion at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert isinstance(loop, SimLoop), "the simulator's disk runner needs the simulator's loop"
        self._loop = loop

    def start(self, work: Callable[[], _T], done: Callable[[_T], None]) -> None:
        loop = self._loop

        def run() -> None:
            loop.record("exec", "disk pass")
            done(work())

        loop.call_soon(run)

    def gather(self, jobs: Sequence[Callable[[], _T]], late: Callable[[_T], None]) -> list[_T]:
        return [job() for job in jobs]

    def shutdown(self) -> None:
        pass


def run(seed: int, main: Callable[[], Any]) -> tuple[Any, SimLoop]:
    """Run coroutine function ``main`` to its end on a new :class:`SimLoop` of ``seed``; the loop
    is returned closed, with its trace."""
    loop = SimLoop(seed)
    try:
        asyncio.set_event_loop(loop)
        result = loop.run_until_complete(main())
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return result, loop
