"""The disk pool's gather (issue 33): a pass of several partitions waits for its batches with
one wake-up, released by the last batch done or at PASS_WAIT_MS; every batch's result comes
back once, in the pass's order, or later to ``late`` on the loop. Real threads, real pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from waltz_engine.storage.node.disk_passes import DISK_POOL_THREADS, PASS_WAIT_MS, ThreadedRunner

JOBS = DISK_POOL_THREADS - 1


def _job(index: int, delay_s: float, started: list[int], lock: threading.Lock) -> Callable[[], int]:
    def run() -> int:
        with lock:
            started.append(index)
        time.sleep(delay_s)
        return index

    return run


def test_a_pass_gets_every_result_in_order_when_they_finish_in_reverse() -> None:
    """The first job to finish is the pass's last: the pass still waits for all of them."""

    async def go() -> None:
        runner = ThreadedRunner(asyncio.get_running_loop())
        started: list[int] = []
        lock = threading.Lock()
        late: list[int] = []
        try:
            for _ in range(3):
                jobs = [_job(i, (JOBS - i) * 0.004, started, lock) for i in range(JOBS)]
                results = await asyncio.to_thread(runner.gather, jobs, late.append)
                assert results == list(range(JOBS))
            assert late == []
        finally:
            await asyncio.to_thread(runner.shutdown)

    asyncio.run(go())


def test_a_slow_job_is_given_to_late_and_the_others_are_not_held() -> None:
    """Job 1 is still running at PASS_WAIT_MS: the pass returns the others then, and job 1's
    result reaches ``late`` on the loop once it is done (once, and only there)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        runner = ThreadedRunner(loop)
        release = threading.Event()
        late: list[int] = []
        late_seen = asyncio.Event()

        def on_late(result: int) -> None:
            assert threading.current_thread() is threading.main_thread()  # the loop's thread
            late.append(result)
            late_seen.set()

        def slow() -> int:
            release.wait()
            return 1

        try:
            jobs: list[Callable[[], int]] = [lambda: 0, slow, lambda: 2, lambda: 3]
            begun_s = time.monotonic()
            results = await asyncio.to_thread(runner.gather, jobs, on_late)
            waited_s = time.monotonic() - begun_s
            assert results == [0, 2, 3]
            assert waited_s >= PASS_WAIT_MS / 1000 * 0.9
            assert late == []
            release.set()
            await asyncio.wait_for(late_seen.wait(), 10)
            assert late == [1]
        finally:
            release.set()
            await asyncio.to_thread(runner.shutdown)

    asyncio.run(go())
