"""The node's disk passes: the partitions' batches that are ready together go to disk together.

A partition's worker with requests queued and no batch on disk is *ready*. When no pass is
running, the first ready worker schedules one for the loop's next turn, so every request read
in this turn (from any connection) joins it; while a pass runs, every worker that becomes ready
waits for the next one, which takes them all. (That turn replaces the one the executor's future
cost on the way back: a request waiting alone goes through as many turns as before.)

A pass hands each ready worker's batch (its whole queue, up to its capacity) to a thread of the
node's disk pool in one trip; with more than one partition in it, their batches (writes and fsyncs)
run concurrently on the other threads of the pool, so the file system's journal can merge the
fsyncs; or, where the node syncs a pass's partitions together (``storage.sync.scope``,
``sync_all``), every batch runs on the pass's own thread with a lone append's sync held, and one
``syncfs`` makes them all durable (waltz_engine/storage/held_append.py). The pass ends on its
thread: all its replies go out with one write per connection straight from that thread
(``FramedConnection.send_frames_from_thread``), and the partitions that queued more meanwhile go to
the next pass from there, so a lone request costs one hop to the pool and none back (a pass that a
data connection's thread starts runs on that thread: no hop at all, connection_threads.py) (the hop
back, a wake-up of the loop through its self-pipe and a loop turn, was a third of a lone request's
CPU). The passes' state is shared by the loop and the pool under one lock (:attr:`DiskPasses.lock`,
the workers' queues' too); loop-only objects (futures, timers) are reached from the pool with
``call_soon_threadsafe``, on the rare paths that need them (a full queue, a pass left behind, the
node stopping). In the simulator the runner ends a pass on the loop, as every pass did before.

Per partition nothing changes: one batch of a partition at a time, in its queue's order, each
SUCCESS after its records are durable. A partition's disk error fails only its own requests. A
slow fsync delays other partitions by at most PASS_WAIT_MS: within a pass, a partition still on
disk then is left behind and its replies go out on their own when it is done; a pass still on
disk then while other partitions wait (a partition alone in its pass runs on the pass's thread)
is left behind whole, and the next pass starts beside it on another thread. A pass synced together
is one sync: a failed ``syncfs`` fails every partition of it, and a slow one holds the whole pass
(the next pass starts beside it after PASS_WAIT_MS, as for a pass of one partition).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from waltz_engine.common.loop_turns import call_at_turn_end
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.net.channel import ConnectionClosedError, FramedConnection
from waltz_engine.storage.held_append import PassSyncs, SharedSync

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

    def take_batch(self, on_loop: bool) -> list[Any]:
        """Under :attr:`DiskPasses.lock`, on the loop (``on_loop``) or the pass's thread: the
        requests for this pass; the worker is busy until :meth:`batch_done`."""
        ...

    def process_batch(self, batch: list[Any], syncs: PassSyncs | None = None) -> list[Reply]:
        """Off the loop: do the batch's disk work, return its replies (``syncs``: a lone append's
        sync may be held for the pass's one sync, its replies final once that ran)."""
        ...

    def batch_done(self) -> bool:
        """Under :attr:`DiskPasses.lock`: the batch is answered; True when more requests are queued."""
        ...


class DiskRunner(Protocol):
    """Where a pass's disk work runs. Production: :class:`ThreadedRunner`; the simulator runs
    it on its own scheduler (waltz_engine/sim/loop.py's ``SimDiskRunner``)."""

    # True: ``done`` runs on the thread that ran ``work``; False: on the loop.
    done_off_loop: bool

    def start(self, work: Callable[[], _R], done: Callable[[_R], None]) -> None:
        """Run ``work`` off the event loop, then ``done(result)`` (see :attr:`done_off_loop`)."""
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
    keeps its thread; the next pass takes another. A pass ends on its thread (no hop back).
    """

    done_off_loop = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._pool = [_daemon(self._jobs, f"storage-disk-{i}") for i in range(DISK_POOL_THREADS)]

    def start(self, work: Callable[[], _R], done: Callable[[_R], None]) -> None:
        self._jobs.put(lambda: done(work()))

    def gather(self, jobs: Sequence[Callable[[], _R]], late: Callable[[_R], None]) -> list[_R]:
        if len(jobs) == 1:
            # A partition alone waits for nobody: no hop to the pool.
            return [jobs[0]()]
        # The pass's thread is woken once, by the last job done (or at PASS_WAIT_MS), not once
        # per job: at 16 active partitions a pass carries 7-8 partitions, and each wake-up of
        # the gathering thread was a context switch and a GIL hand-off (docs/benchmarks.md).
        results: list[_R | _NotDone] = [_NOT_DONE] * len(jobs)
        state = threading.Lock()  # guards ``results``, ``left`` and ``waiting``
        left = [len(jobs)]
        waiting = [True]
        all_done = threading.Lock()
        all_done.acquire()  # released by the last job done while the pass waits
        loop = self._loop

        def run(index: int, job: Callable[[], _R]) -> None:
            result = job()
            with state:
                if waiting[0]:
                    results[index] = result
                    left[0] -= 1
                    if left[0] == 0:
                        all_done.release()
                    return
            loop.call_soon_threadsafe(late, result)

        for index, job in enumerate(jobs):
            self._jobs.put(functools.partial(run, index, job))
        all_done.acquire(timeout=PASS_WAIT_MS / 1000)
        with state:
            waiting[0] = False
        return [result for result in results if not isinstance(result, _NotDone)]

    def shutdown(self) -> None:
        for _ in self._pool:
            self._jobs.put(None)
        for thread in self._pool:
            thread.join()


class _NotDone:
    """A job of :meth:`ThreadedRunner.gather` not done (yet)."""


_NOT_DONE = _NotDone()


def _daemon(tasks: queue.SimpleQueue[Callable[[], object] | None], name: str) -> threading.Thread:
    def serve() -> None:
        while (task := tasks.get()) is not None:
            try:
                task()
            except Exception:
                # A bug: the thread serves the next passes all the same.
                log.exception("a disk pass failed")

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    return thread


RunnerFactory = Callable[[asyncio.AbstractEventLoop], DiskRunner]
Outcome = tuple[BatchOwner, list[Reply]]


class DiskPasses:
    """One per node: on the event loop, but a pass's work and its end on the runner's thread;
    the state below is shared under :attr:`lock`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        runner: DiskRunner,
        registry: MetricsRegistry,
        metric_group: str,
        sync_all: SharedSync | None = None,
    ) -> None:
        """``sync_all``: a pass of several partitions runs their batches on its own thread and
        makes them durable with this one sync of the whole disk (None: each file its own sync)."""
        self._loop = loop
        self._sync_all = sync_all
        self._runner = runner
        self._done_off_loop = runner.done_off_loop
        # Guards the state below and the workers' queues and busy flags (held briefly, never
        # across disk work or a write to a socket).
        self.lock = threading.Lock()
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
        # Batches a data connection's thread ran itself, outside the passes (:meth:`run_claimed`).
        self._claimed = registry.counter(metric_group, "disk-connection-thread-batches")
        # Passes a data connection's thread ran itself (:meth:`ready_off_loop` ``here``).
        self._passes_here = registry.counter(metric_group, "disk-connection-thread-passes")
        # Whole-disk syncs that made a pass's partitions durable together (``sync_all``).
        self._shared_syncs = registry.counter(metric_group, "disk-pass-shared-syncs")

    def ready(self, worker: BatchOwner) -> None:
        """On the loop, under :attr:`lock`: ``worker`` has requests queued and no batch on disk."""
        self._ready[worker] = None
        if not self._running:
            self._running = True
            # At the end of the loop turn, so every request read in it joins the pass; a lone
            # request's read callback, the turn's last, starts it at once (no select between).
            call_at_turn_end(self._loop, self._start_pass_on_loop)
        elif self._on_disk is not None and self._watchdog is None:
            self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        """On the loop, under :attr:`lock`."""
        wait_s = self._on_disk_since_s + PASS_WAIT_MS / 1000 - self._loop.time()
        self._watchdog = self._loop.call_later(max(0.0, wait_s), self._leave_behind, self._on_disk)

    def _arm_watchdog_if_due(self) -> None:
        """On the loop: a pass left behind ended on its thread and its partitions wait."""
        with self.lock:
            if self._ready and self._on_disk is not None and self._watchdog is None:
                self._arm_watchdog()

    def _leave_behind(self, on_disk: object) -> None:
        """The pass on disk has kept ready partitions waiting PASS_WAIT_MS: start the next beside it."""
        with self.lock:
            if on_disk is not self._on_disk or self._watchdog is None:
                return  # (it ended meanwhile, on its thread)
            self._watchdog = None
            if not self._ready:
                return
            self._on_disk = None
            self._late.inc()
            self._start_pass(on_loop=True)

    def _start_pass_on_loop(self) -> None:
        with self.lock:
            self._start_pass(on_loop=True)

    def _start_pass(self, on_loop: bool, here: bool = False) -> Callable[[], None] | None:
        """Under :attr:`lock`, on the loop or (the next pass) on the thread of the pass that ended.
        ``here``: the pass is returned for the caller to run once it released the lock."""
        if self._stopped or not self._ready:
            self._running = False
            return None
        taken = [(worker, worker.take_batch(on_loop)) for worker in self._ready]
        self._ready.clear()
        self._running = True
        self._busy += len(taken)
        self._passes.inc()
        self._batches.inc(len(taken))
        on_disk = self._on_disk = object()
        self._on_disk_since_s = self._loop.time()
        if here:
            self._passes_here.inc()
            return lambda: self._pass_done(on_disk, self._run(taken))
        self._runner.start(lambda: self._run(taken), functools.partial(self._pass_done, on_disk))
        return None

    def _run(self, taken: list[tuple[BatchOwner, list[Any]]]) -> list[Outcome]:
        """On the pass's thread of the pool."""
        if len(taken) == 1:
            # A partition alone (one appender): no jobs to build; every runner's gather would
            # run its one job right here.
            ((worker, batch),) = taken
            return [_process(worker, batch)]
        if self._sync_all is not None:
            return self._run_synced_together(taken)
        jobs = [lambda worker=worker, batch=batch: _process(worker, batch) for worker, batch in taken]
        return self._runner.gather(jobs, self._late_done)

    def _run_synced_together(self, taken: list[tuple[BatchOwner, list[Any]]]) -> list[Outcome]:
        """A pass of several partitions, on its own thread: each batch in turn, a lone append's
        sync held (its partition's lock too), then one sync of the whole disk for them all
        (waltz_engine/storage/held_append.py); no pool thread, so no hand-off of the GIL."""
        assert self._sync_all is not None
        syncs = PassSyncs(functools.partial(self._sync_disk, self._sync_all.mark()))
        try:
            outcomes = [_process(worker, batch, syncs) for worker, batch in taken]
        except BaseException:
            syncs.abandon()  # the machine died in a write (the simulator): no sync, no answer
            raise
        syncs.finish()
        return outcomes

    def _sync_disk(self, mark: int) -> None:
        assert self._sync_all is not None
        self._shared_syncs.inc()
        self._sync_all.sync(mark)

    def _pass_done(self, on_disk: object, outcomes: list[Outcome]) -> None:
        """On the pass's thread (the loop's in the simulator): answer, then the next pass."""
        on_loop = not self._done_off_loop
        self._send(outcomes, on_loop)
        with self.lock:
            current = on_disk is self._on_disk
            if current:
                self._on_disk = None
                watchdog, self._watchdog = self._watchdog, None
                if watchdog is not None:
                    if on_loop:
                        watchdog.cancel()
                    else:
                        self._loop.call_soon_threadsafe(watchdog.cancel)
            # (Left behind: the passes went on without it; its partitions are ready anew.)
            self._batches_done(outcomes, on_loop)
            if current:
                # What queued while the pass was on disk goes at once: it has waited a pass already.
                self._start_pass(on_loop)

    def _late_done(self, outcome: Outcome) -> None:
        """On the loop: a partition a pass of several left behind."""
        self._late.inc()
        self._send([outcome], on_loop=True)
        with self.lock:
            self._batches_done([outcome], on_loop=True)

    def _send(self, outcomes: list[Outcome], on_loop: bool) -> None:
        """The replies, one write per connection (not under :attr:`lock`)."""
        if len(outcomes) == 1 and len(outcomes[0][1]) == 1:
            # A lone request's answer (one appender): nothing to group.
            ((conn, frame),) = outcomes[0][1]
            self._answer(conn, (frame,), on_loop)
            return
        by_connection: dict[FramedConnection, list[bytes]] = {}
        for _, replies in outcomes:
            for conn, frame in replies:
                by_connection.setdefault(conn, []).append(frame)
        for conn, frames in by_connection.items():
            self._answer(conn, frames, on_loop)

    def _answer(self, conn: FramedConnection, frames: Sequence[bytes], on_loop: bool) -> None:
        # The client may be gone; its requests were processed all the same.
        try:
            if on_loop:
                conn.send_frames(frames)
            else:
                conn.send_frames_from_thread(frames, self._loop)
        except ConnectionClosedError:
            pass

    def _batches_done(self, outcomes: list[Outcome], on_loop: bool) -> None:
        """Under :attr:`lock`: the outcomes' partitions are answered; those with more queued are
        ready again."""
        self._busy -= len(outcomes)
        again = [worker for worker, _ in outcomes if worker.batch_done()]
        if again:
            if on_loop:
                for worker in again:
                    self.ready(worker)
            else:
                self.ready_off_loop(again)
        self._idle_if_done(on_loop)

    def _idle_if_done(self, on_loop: bool) -> None:
        """Under :attr:`lock`: :meth:`stop` waits for no batch any more."""
        idle = self._idle
        if idle is not None and self._busy == 0:
            if on_loop:
                _resolve(idle)
            else:
                self._loop.call_soon_threadsafe(_resolve, idle)

    def ready_off_loop(self, workers: Sequence[BatchOwner], here: bool = False) -> Callable[[], None] | None:
        """Under :attr:`lock`, off the loop (the thread of a pass that ended, a data connection's
        thread): ``workers`` have requests queued and no batch on disk. They go now unless a
        pass runs, which takes them next."""
        for worker in workers:
            self._ready[worker] = None
        if not self._running:
            self._running = True
            return self._start_pass(on_loop=False, here=here)
        if self._on_disk is not None and self._watchdog is None:
            self._loop.call_soon_threadsafe(self._arm_watchdog_if_due)
        return None

    def claim(self) -> bool:
        """Under :attr:`lock`, off the loop: a data connection's thread is to run one partition's
        batch itself (its worker made busy by the caller), outside any pass: counted as on disk,
        so :meth:`stop` waits for it. False once stopping: queue it instead (as the loop would)."""
        if self._stopped:
            return False
        self._busy += 1
        self._claimed.inc()
        return True

    def count_late(self) -> None:
        """A data connection's thread left behind on disk (connection_threads.py)."""
        self._late.inc()

    def run_claimed(self, worker: BatchOwner, batch: list[Any]) -> None:
        """Off the loop, not under :attr:`lock`: a batch :meth:`claim` counted, made durable and
        answered on the caller's thread; what its partition queued meanwhile goes to a pass."""
        outcome = _process(worker, batch)
        self._send([outcome], on_loop=False)
        with self.lock:
            self._batches_done([outcome], on_loop=False)

    def claimed_done(self, worker: BatchOwner) -> None:
        """Off the loop, not under :attr:`lock`: :meth:`run_claimed`'s end for a batch of one that
        the caller made durable and answered itself (a data connection thread's lone APPEND,
        connection_threads.py): what its partition queued meanwhile goes to a pass."""
        with self.lock:
            self._busy -= 1
            if worker.batch_done():
                self.ready_off_loop((worker,))
            self._idle_if_done(on_loop=False)

    async def stop(self) -> None:
        """Start no more passes; the batches on disk complete and are answered first."""
        with self.lock:
            self._stopped = True
            if self._busy:
                self._idle = asyncio.get_running_loop().create_future()
            idle = self._idle
        if idle is not None:
            await idle
        await asyncio.get_running_loop().run_in_executor(None, self._runner.shutdown)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _process(worker: BatchOwner, batch: list[Any], syncs: PassSyncs | None = None) -> Outcome:
    try:
        return worker, (worker.process_batch(batch) if syncs is None else worker.process_batch(batch, syncs))
    except Exception:
        # A bug, not a disk error (those are answered per request): this batch goes unanswered,
        # the other partitions' are not affected.
        log.exception("partition %d: a batch failed", worker.partition_id)
        return worker, []
