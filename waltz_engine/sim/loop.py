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
import contextlib
import contextvars
import functools
import hashlib
import heapq
import random
import selectors
import struct
import weakref
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar

from waltz_engine.common import clock
from waltz_engine.common.errors import WaltzError

_T = TypeVar("_T")

# Virtual time starts here, not at zero: code that treats 0 as "never" sees a real-looking clock.
START_MONOTONIC_S = 10_000.0
# The virtual wall clock at START_MONOTONIC_S (2025-11-25T00:00:00Z), for timestamps on disk.
START_WALL_NS = 1_764_028_800 * 1_000_000_000
# The events kept in words for a failing seed's report.
TRACE_TAIL_EVENTS = 200
_TURN = struct.Struct("<dI")
TRACE_HASH_BUFFER_BYTES = 64 * 1024


class Incarnation:
    """One life of a simulated host's machine: the code of a node started on it, its callbacks
    (each carries it in its context) and tasks. A power loss ends it (:meth:`SimLoop.kill_host`);
    the host's next start is a new one."""

    __slots__ = ("host", "alive", "context", "tasks")

    def __init__(self, host: str) -> None:
        self.host = host
        self.alive = True
        self.context = contextvars.Context()
        self.context.run(CURRENT_HOST.set, self)
        self.tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


# Whose code runs: every task and callback carries the incarnation of the host it belongs to in
# its context, so a host's machine can be killed at once. None: the world's own code.
CURRENT_HOST: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar(
    "waltz_sim_host", default=None
)


class SimulatedCrash(BaseException):
    """The simulated machine died inside a disk call (not an error the engine may handle)."""


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

    # The loop's heap holds only these (SimLoop.call_at makes every timer): compared there on
    # every push and pop, so straight from the fields.
    def __lt__(self, other: _SimTimerHandle) -> bool:  # type: ignore[override]
        return (self._when, self._sequence) < (other._when, other._sequence)  # type: ignore[attr-defined]

    def __le__(self, other: _SimTimerHandle) -> bool:  # type: ignore[override]
        return (self._when, self._sequence) <= (other._when, other._sequence)  # type: ignore[attr-defined]


class SimLoop(asyncio.BaseEventLoop):
    """asyncio's loop with virtual time, executors run inline, one seeded generator and a trace."""

    # BaseEventLoop's own state, which typeshed does not declare.
    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _check_closed: Callable[[], None]
    _debug: bool

    def __init__(self, seed: int) -> None:
        super().__init__()
        clock.own_clock_loop_opened()  # (until :meth:`close`: the library's clock asks this loop)
        self._clock_told = True
        self.seed = seed
        self.rng = random.Random(seed)
        self._now = START_MONOTONIC_S
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9
        self._hash = hashlib.blake2b(digest_size=16)
        self._hash.update(struct.pack("<q", seed))
        # What the trace adds, hashed a buffer at a time (a hash of the bytes in order, however
        # they are split: the same digest as an update per turn, for less CPU).
        self._unhashed = bytearray()
        self.events = 0
        self.tail: collections.deque[SimEvent] = collections.deque(maxlen=TRACE_TAIL_EVENTS)
        self._timers_set = 0
        # Each host's current life, for :meth:`kill_host`; the ended ones and their tasks, held
        # until :meth:`revive_the_dead` (collected mid-run, a task's coroutine would run its
        # ``finally`` at an arbitrary moment).
        self._incarnations: dict[str, Incarnation] = {}
        self._dead: list[tuple[Incarnation, list[asyncio.Task[Any]]]] = []
        # The dead machines' tasks whose coroutines :meth:`bury_the_dead` closed: pending for
        # asyncio (a task is done only by its own step, and theirs never comes) but over.
        self._buried: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        # Callbacks scheduled past call_soon and call_at (call_soon_threadsafe): a host's death
        # never cancelled them, and does not.
        self._untagged: weakref.WeakSet[asyncio.Handle] = weakref.WeakSet()
        # Told the host whose code died in a disk call (SimulatedCrash): the world kills it.
        self.on_crash: Callable[[str], None] | None = None

    # Hosts: whose code a callback or task is, and killing a host's machine.

    def host_context(self, host: str) -> contextvars.Context:
        """The context of ``host``'s current life, shared by the callbacks scheduled into it (never
        entered twice at once: the loop runs one callback at a time)."""
        incarnation = self._incarnations.get(host)
        if incarnation is None:
            incarnation = self._incarnations[host] = Incarnation(host)
        return incarnation.context

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if self._debug:
            handle = super().call_soon(callback, *args, context=context)
        else:  # asyncio's call_soon without debug, in one frame (the loop's most frequent call)
            self._check_closed()
            handle = asyncio.Handle(callback, args, self, context)
            self._ready.append(handle)
        self._tag(handle, context)
        return handle

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
        self._tag(timer, context)
        return timer

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        self._untagged.add(handle)
        return handle

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, _T] | Generator[Any, None, _T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        task = super().create_task(coro, name=name, context=context)
        incarnation = CURRENT_HOST.get() if context is None else context.get(CURRENT_HOST)
        if incarnation is not None:
            incarnation.tasks.add(task)
        return task

    def _tag(self, handle: asyncio.Handle, context: contextvars.Context | None) -> None:
        incarnation = CURRENT_HOST.get() if context is None else context.get(CURRENT_HOST)
        if incarnation is not None and not incarnation.alive:
            handle.cancel()  # a dead machine's code never runs again

    def kill_host(self, host: str) -> None:
        """``host``'s machine dies, as with ``kill -9`` of everything on it: none of its pending
        callbacks runs, nor any scheduled for it later, so its tasks (its cleaner, scrubber, tier,
        workers, connections) never step again, not even to run their ``finally``; they are left
        to the garbage collector, unmourned. Its next start is a new incarnation."""
        incarnation = self._incarnations.pop(host, None)
        self.record("kill", host)
        if incarnation is None:
            return
        incarnation.alive = False
        # Its pending callbacks: every callback not yet run is in the ready queue or the timers'
        # heap, and carries its host's incarnation in its context (the context it was scheduled
        # in, or a copy of it).
        for handle in [*self._ready, *self._scheduled]:
            if handle._context.get(CURRENT_HOST) is incarnation and handle not in self._untagged:  # type: ignore[attr-defined]
                handle.cancel()
        self._dead.append((incarnation, list(incarnation.tasks)))

    def bury_the_dead(self) -> None:
        """After a run, from a task of this loop (:func:`~waltz_engine.sim.seed.end_leftovers`):
        close the dead machines' coroutines (their ``finally`` meets only closed files and dead
        connections), rather than leave them to the garbage collector after the loop closed. On
        the running loop, as code on a loop runs: a cleanup may ask for the current task (a
        replica session's close does; closed between the loop's runs, it raised "no running
        event loop", which the store's driver logged with its traceback)."""
        assert self.is_running(), "the dead are buried by a task of their loop"
        for _, dead_tasks in self._dead:
            for task in dead_tasks:
                if task.done():
                    continue
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                with contextlib.suppress(Exception):
                    task.get_coro().close()
                self._buried.add(task)
        self._dead.clear()

    def live_tasks(self) -> set[asyncio.Task[Any]]:
        """The tasks not done that can still step: ``asyncio.all_tasks`` but the buried ones."""
        return {task for task in asyncio.all_tasks(self) if task not in self._buried}

    def crashed(self) -> None:
        """The running code's machine died in a disk call: the world kills it now, in this turn."""
        incarnation = CURRENT_HOST.get()
        if incarnation is not None and self.on_crash is not None:
            self.on_crash(incarnation.host)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), SimulatedCrash):
            return  # a dead machine's task, ended by its crash (the world killed the machine)
        task = context.get("future")
        if isinstance(task, asyncio.Task) and type(task.get_coro()).__name__ == "async_generator_athrow":
            # The garbage collector finalized an async generator a dead machine's task was
            # suspended in; asyncio closes it in a task, which the generator refuses ("already
            # running"). Nothing is left to close: not a finding, and not worth a traceback on
            # stderr per generator after the seed.
            return
        super().call_exception_handler(context)

    # The clock.

    def time(self) -> float:
        return self._now

    def close(self) -> None:
        super().close()
        if self._clock_told:
            self._clock_told = False
            clock.own_clock_loop_closed()

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
        self._unhashed += _TURN.pack(self._now, ready)
        if len(self._unhashed) >= TRACE_HASH_BUFFER_BYTES:
            self._hash.update(self._unhashed)
            self._unhashed.clear()

    # The trace.

    def record(self, kind: str, detail: str) -> None:
        """Add an event of the simulated world to the trace (and to its hash)."""
        self.events += 1
        self.tail.append(SimEvent(self._now, kind, detail))
        self._unhashed += f"{self._now!r}|{kind}|{detail}\n".encode()

    @property
    def trace_hash(self) -> str:
        """The running hash of the trace so far, as hex."""
        self._hash.update(self._unhashed)
        self._unhashed.clear()
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
            except SimulatedCrash as e:
                future.set_exception(e)
                self.crashed()
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
    turn, its partitions' batches one after another; its completion (the replies) comes once the
    syncs it made have taken their time (``sync_delay_ms``: the disk's slow fsyncs), so a power
    loss can fall between a pass's syncs and its acknowledgements. A machine that dies inside a
    pass (:class:`SimulatedCrash`) is killed in the same turn: the pass never completes."""

    # The simulator has no threads: a pass ends on the loop.
    done_off_loop = False

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sync_delay_ms: Callable[[], float] | None = None
    ) -> None:
        assert isinstance(loop, SimLoop), "the simulator's disk runner needs the simulator's loop"
        self._loop = loop
        self._sync_delay_ms = sync_delay_ms

    def start(self, work: Callable[[], _T], done: Callable[[_T], None]) -> None:
        loop = self._loop

        def run() -> None:
            loop.record("exec", "disk pass")
            try:
                result = work()
            except SimulatedCrash:
                loop.crashed()
                return
            delay_ms = self._sync_delay_ms() if self._sync_delay_ms is not None else 0.0
            if delay_ms > 0:
                loop.call_later(delay_ms / 1000, done, result)
            else:
                done(result)

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
