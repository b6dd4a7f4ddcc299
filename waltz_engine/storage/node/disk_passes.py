"""The node's disk passes: the partitions' batches that are ready together go to disk together.

A partition's worker with requests queued and no batch on disk is *ready*. When no pass is
running, the first ready worker schedules one for the loop's next turn, so every request read
in this turn (from any connection) joins it; while a pass runs, every worker that becomes ready
waits for the next one, which takes them all. (That turn replaces the one the executor's future
cost on the way back: a request waiting alone goes through as many turns as before.)

A pass hands each ready worker's batch (its whole queue, up to its capacity) to a thread of the
node's disk pool in one trip; with more than one partition in it, their batches (writes and
fsyncs) run concurrently on the other threads of the pool, so the file system's journal can
merge the fsyncs. When the pass is back on the event loop, all its replies go out with one
``send_frames`` per connection.

Per partition nothing changes: one batch of a partition at a time, in its queue's order, each
SUCCESS after its records are durable. A partition's disk error fails only its own requests. A
slow fsync delays other partitions by at most PASS_WAIT_MS: within a pass, a partition still on
disk then is left behind and its replies go out on their own when it is done; a pass still on
disk then while other partitions wait (a partition alone in its pass runs on the pass's thread)
is left behind whole, and the next pass starts beside it on another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from waltz_engine.common import clock
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.channel import ConnectionClosedError, FramedConnection

log = logging.getLogger(__name__)

# Partitions whose batches run at once in a pass: the fsyncs the journal may merge.
DISK_POOL_THREADS = 8
# How long a pass waits for its slowest partition before it answers the others.
PASS_WAIT_MS = 100

_R = TypeVar("_R")
Reply = tuple[FramedConnection, bytes]


class BatchOwner(Protocol):
    """What a pass needs of a partition's worker (:class:`PartitionWorker`)."""

    partition_id: int

    def take_batch(self) -> list[Any]:
        """On the loop: the requests for this pass; the worker is busy until :meth:`batch_done`."""
        ...

    def process_batch(self, batch: list[Any]) -> list[Reply]:
        """Off the loop: do the batch's disk work, return its replies."""
        ...

    def batch_done(self) -> bool:
        """On the loop: the batch is answered; True when more requests are queued."""
        ...


class DiskRunner(Protocol):
    """Where a pass's disk work runs. Production: :class:`ThreadedRunner`; the simulator runs
    it on its own scheduler (waltz_engine/sim/loop.py's ``SimDiskRunner``)."""

    def start(self, work: Callable[[], _R], done: Callable[[_R], None]) -> None:
        """Run ``work`` off the event loop, then ``done(result)`` on the loop."""
        ...

    def gather(self, jobs: Sequence[Callable[[], _R]], late: Callable[[_R], None]) -> list[_R]:
        """From ``work``: run ``jobs`` at once and return the results of those done within
        PASS_WAIT_MS, in order; each of the others is given to ``late`` on the loop."""
        ...

    def shutdown(self) -> None:
        """Blocking: end the threads once their work is done."""
        ...


class ThreadedRunner:
    """A pool of threads for the passes and the batches of a pass with more than one partition.

    Plain threads on a C queue (``queue.SimpleQueue``) rather than executors: a hop costs a put
    and a get, with no future, work item or waiter built in Python for each. A pass left behind
    keeps its thread; the next pass takes another.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._pool = [_daemon(self._jobs, f"storage-disk-{i}") for i in range(DISK_POOL_THREADS)]

    def start(self, work: Callable[[], _R], done: Callable[[_R], None]) -> None:
        loop = self._loop
        # Straight to the loop's ready queue: no future whose done callback costs a turn more.
        self._jobs.put(lambda: loop.call_soon_threadsafe(done, work()))

    def gather(self, jobs: Sequence[Callable[[], _R]], late: Callable[[_R], None]) -> list[_R]:
        if len(jobs) == 1:
            # A partition alone waits for nobody: no hop to the pool.
            return [jobs[0]()]
        back: queue.SimpleQueue[tuple[int, _R]] = queue.SimpleQueue()
        lock = threading.Lock()
        waiting = [True]
        loop = self._loop

        def run(index: int, job: Callable[[], _R]) -> None:
            result = job()
            with lock:
                if waiting[0]:
                    back.put((index, result))
                    return
            loop.call_soon_threadsafe(late, result)

        for index, job in enumerate(jobs):
            self._jobs.put(functools.partial(run, index, job))
        results: dict[int, _R] = {}
        deadline_s = clock.monotonic_s() + PASS_WAIT_MS / 1000
        with contextlib.suppress(queue.Empty):
            while len(results) < len(jobs):
                index, result = back.get(timeout=max(0.0, deadline_s - clock.monotonic_s()))
                results[index] = result
        if len(results) < len(jobs):
            with lock:
                waiting[0] = False
            with contextlib.suppress(queue.Empty):
                while True:
                    index, result = back.get_nowait()
                    results[index] = result
        return [results[index] for index in sorted(results)]

    def shutdown(self) -> None:
        for _ in self._pool:
            self._jobs.put(None)
        for thread in self._pool:
            thread.join()


def _daemon(tasks: queue.SimpleQueue[Callable[[], object] | None], name: str) -> threading.Thread:
    def serve() -> None:
        while (task := tasks.get()) is not None:
            task()

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    return thread


RunnerFactory = Callable[[asyncio.AbstractEventLoop], DiskRunner]
Outcome = tuple[BatchOwner, list[Reply]]


class DiskPasses:
    """One per node; all on the event loop except the work handed to the runner."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        runner: DiskRunner,
        registry: MetricsRegistry,
        metric_group: str,
    ) -> None:
        self._loop = loop
        self._runner = runner
        # An ordered set: the ready workers, in the order they became ready.
        self._ready: dict[BatchOwner, None] = {}
        # A pass is on disk, or scheduled to start at the next turn.
        self._running = False
        # The pass on disk (None: none, or left behind) and when it started (loop time); the
        # timer that leaves it behind once a waiting partition has waited PASS_WAIT_MS.
        self._on_disk: object | None = None
        self._on_disk_since_s = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        # Workers with a batch on disk (in the running pass or left behind by one).
        self._busy = 0
        self._stopped = False
        self._idle: asyncio.Future[None] | None = None
        # How many passes ran, and how many partition batches they carried (the ratio is the
        # width of a pass); each slow partition left behind by a pass.
        self._passes = registry.counter(metric_group, "disk-passes")
        self._batches = registry.counter(metric_group, "disk-pass-batches")
        self._late = registry.counter(metric_group, "disk-pass-late-batches")

    def ready(self, worker: BatchOwner) -> None:
        """``worker`` has requests queued and no batch on disk."""
        self._ready[worker] = None
        if not self._running:
            self._running = True
            self._loop.call_soon(self._start_pass)
        elif self._on_disk is not None and self._watchdog is None:
            wait_s = self._on_disk_since_s + PASS_WAIT_MS / 1000 - self._loop.time()
            self._watchdog = self._loop.call_later(max(0.0, wait_s), self._leave_behind, self._on_disk)

    def _leave_behind(self, on_disk: object) -> None:
        """The pass on disk has kept ready partitions waiting PASS_WAIT_MS: start the next beside it."""
        self._watchdog = None
        if on_disk is self._on_disk and self._ready:
            self._on_disk = None
            self._late.inc()
            self._start_pass()

    def _start_pass(self) -> None:
        if self._stopped or not self._ready:
            self._running = False
            return
        taken = [(worker, worker.take_batch()) for worker in self._ready]
        self._ready.clear()
        self._running = True
        self._busy += len(taken)
        self._passes.inc()
        self._batches.inc(len(taken))
        on_disk = self._on_disk = object()
        self._on_disk_since_s = self._loop.time()
        self._runner.start(lambda: self._run(taken), functools.partial(self._pass_done, on_disk))

    def _run(self, taken: list[tuple[BatchOwner, list[Any]]]) -> list[Outcome]:
        """On the pass's thread of the pool."""
        if len(taken) == 1:
            # A partition alone (one appender): no jobs to build; every runner's gather would
            # run its one job right here.
            ((worker, batch),) = taken
            return [_process(worker, batch)]
        jobs = [lambda worker=worker, batch=batch: _process(worker, batch) for worker, batch in taken]
        return self._runner.gather(jobs, self._late_done)

    def _pass_done(self, on_disk: object, outcomes: list[Outcome]) -> None:
        if on_disk is not self._on_disk:
            # Left behind: the passes went on without it; its partitions are ready anew.
            self._answer(outcomes)
            return
        self._on_disk = None
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        self._answer(outcomes)
        # What queued while the pass was on disk goes at once: it has waited a pass already.
        self._start_pass()

    def _late_done(self, outcome: Outcome) -> None:
        self._late.inc()
        self._answer([outcome])

    def _answer(self, outcomes: list[Outcome]) -> None:
        by_connection: dict[FramedConnection, list[bytes]] = {}
        for _, replies in outcomes:
            for conn, frame in replies:
                by_connection.setdefault(conn, []).append(frame)
        for conn, frames in by_connection.items():
            # The client may be gone; its requests were processed all the same.
            with contextlib.suppress(ConnectionClosedError):
                conn.send_frames(frames)
        self._busy -= len(outcomes)
        for worker, _ in outcomes:
            if worker.batch_done():
                self.ready(worker)
        idle = self._idle
        if idle is not None and self._busy == 0 and not idle.done():
            idle.set_result(None)

    async def stop(self) -> None:
        """Start no more passes; the batches on disk complete and are answered first."""
        self._stopped = True
        if self._busy:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        await asyncio.get_running_loop().run_in_executor(None, self._runner.shutdown)


def _process(worker: BatchOwner, batch: list[Any]) -> Outcome:
    try:
        return worker, worker.process_batch(batch)
    except Exception:
        # A bug, not a disk error (those are answered per request): this batch goes unanswered,
        # the other partitions' are not affected.
        log.exception("partition %d: a batch failed", worker.partition_id)
        return worker, []
