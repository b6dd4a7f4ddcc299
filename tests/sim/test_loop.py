"""SimLoop: virtual time, executors run inline on the loop, and a run that is a function of its seed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from waltz_engine.sim.loop import START_MONOTONIC_S, SimLoop, SimStalledError, SimulatedCrash, run
from waltz_engine.sim.seed import end_leftovers

# Far above what the loop needs for an hour of virtual sleep, far below the hour itself.
REAL_TIME_LIMIT_S = 60.0


def test_timers_fire_in_virtual_time_order() -> None:
    fired: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def fire(name: str) -> None:
            fired.append((name, loop.time() - START_MONOTONIC_S))

        for name, delay_s in (("c", 3.0), ("a", 0.5), ("d", 7200.0), ("b", 1.25)):
            loop.call_later(delay_s, fire, name)
        loop.call_later(7200.0, done.set_result, None)
        await done

    run(1, main)
    assert fired == [("a", 0.5), ("b", 1.25), ("c", 3.0), ("d", 7200.0)]


def _in_thread(target: Callable[[], Any]) -> Any:
    """Run ``target`` on a thread, failing if it takes REAL_TIME_LIMIT_S of real time."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(target()), daemon=True)
    thread.start()
    thread.join(REAL_TIME_LIMIT_S)
    assert not thread.is_alive(), "virtual sleeps took real time"
    return results[0]


def test_an_hour_of_sleep_costs_no_real_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        for _ in range(24):
            await asyncio.sleep(3600)
        return loop.time() - START_MONOTONIC_S

    result, _ = _in_thread(lambda: run(1, main))
    assert result == 24 * 3600.0


def test_to_thread_runs_inline_on_the_loop_thread() -> None:
    async def main() -> tuple[int, int, float, float]:
        loop = asyncio.get_running_loop()
        before = loop.time()
        ident = await asyncio.to_thread(threading.get_ident)
        other = await loop.run_in_executor(None, lambda: threading.active_count())
        return ident, other, before, loop.time()

    threads_before = threading.active_count()
    (ident, active, before, after), loop = run(1, main)
    assert ident == threading.get_ident()
    assert active == threads_before
    assert after == before  # no time passes for work done inline
    assert [event.kind for event in loop.tail] == ["exec", "exec"]
    assert loop.tail[0].detail == "_thread.get_ident"


def test_an_executor_error_reaches_the_awaiting_task() -> None:
    def fail() -> None:
        raise OSError("disk gone")

    async def main() -> str:
        try:
            await asyncio.to_thread(fail)
        except OSError as e:
            return str(e)
        return "no error"

    assert run(1, main)[0] == "disk gone"


def test_call_soon_threadsafe_runs_its_callback() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        loop.call_soon_threadsafe(future.set_result, 7)
        return await future

    assert run(1, main)[0] == 7


def test_a_run_waiting_on_nothing_is_reported_stuck() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimStalledError, match="nothing is ready and no timer is set"):
        run(1, main)


async def _jittery_workers() -> None:
    """Workers that sleep for random times from the loop's generator and record what they do."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, SimLoop)

    async def worker(name: str) -> None:
        for step in range(20):
            await asyncio.sleep(loop.rng.uniform(0, 0.01))
            loop.record("step", f"{name} {step}")
            if loop.rng.random() < 0.3:
                await asyncio.to_thread(sum, range(10))

    await asyncio.gather(*(worker(f"w{i}") for i in range(5)))


def test_one_seed_gives_one_trace_and_seeds_differ() -> None:
    loops = [run(seed, _jittery_workers)[1] for seed in (11, 11, 12)]
    assert loops[0].trace_hash == loops[1].trace_hash
    assert list(loops[0].tail) == list(loops[1].tail)
    assert loops[0].trace_hash != loops[2].trace_hash
    steps = [event for event in loops[0].tail if event.kind == "step"]
    assert len(steps) == 100
    assert str(steps[-1]).endswith(f"step: {steps[-1].detail}")


def test_a_killed_host_runs_no_more_code_and_a_crash_in_its_disk_call_kills_it_in_that_turn() -> None:
    ticks: dict[str, int] = {"storage-0": 0, "storage-1": 0}
    crashed: list[str] = []
    finished: list[str] = []

    async def node(host: str) -> None:
        try:
            while True:
                ticks[host] += 1
                await asyncio.sleep(1.0)
        finally:
            finished.append(host)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        loop.on_crash = crashed.append
        for host in ticks:
            loop.create_task(node(host), context=loop.host_context(host))
        await asyncio.sleep(2.5)
        loop.kill_host("storage-0")
        await asyncio.sleep(3.0)

        def die() -> None:
            raise SimulatedCrash("in a write")

        async def disk_call() -> None:
            await asyncio.to_thread(die)

        with pytest.raises(SimulatedCrash):
            await loop.create_task(disk_call(), context=loop.host_context("storage-1"))
        assert finished == []  # no code of the dead machine ran, not even its finally
        loop.bury_the_dead()  # after the run: its coroutine is closed while the loop is open
        assert finished == ["storage-0"]

    run(3, main)
    assert ticks == {"storage-0": 3, "storage-1": 6}
    assert crashed == ["storage-1"]  # told at once, by the host whose code died


def test_a_seeds_leftovers_end_beside_a_dead_machines_buried_tasks() -> None:
    """After a seed, :func:`end_leftovers` ends what can still step (here a node a failed stop
    left running, which reconnects from a timer every second) and does not wait for the tasks
    of a dead machine it buried, which never end: counted, each of its rounds waited its whole
    limit for them while the node started connections the last round never cancelled, destroyed
    pending by the collector once the loop had closed ("Event loop is closed")."""
    loop = SimLoop(4)
    server = loop.host_context("server-0")
    connections: list[asyncio.Task[None]] = []  # the node holds them (the collector does not end them)

    async def connection() -> None:
        await loop.create_future()  # an answer that never comes

    def reconnect() -> None:
        connections.append(loop.create_task(connection(), context=server))
        loop.call_later(1.0, reconnect, context=server)

    try:
        loop.create_task(connection(), context=loop.host_context("storage-0"))
        reconnect()
        loop.run_until_complete(asyncio.sleep(2.5))
        loop.kill_host("storage-0")
        end_leftovers(loop)
        assert loop.live_tasks() == set()
    finally:
        loop.close()


def test_a_dead_machines_coroutines_are_closed_on_the_running_loop() -> None:
    """:func:`end_leftovers` closes a dead machine's coroutines on the running loop: their
    cleanup may ask for the current task (a replica session's close does; closed between the
    loop's runs, it raised "no running event loop")."""
    loop = SimLoop(5)
    seen: list[object] = []

    async def node() -> None:
        try:
            await loop.create_future()  # an answer that never comes: the machine dies meanwhile
        finally:
            try:
                seen.append(asyncio.current_task())
            except RuntimeError as e:
                seen.append(e)

    try:
        loop.create_task(node(), context=loop.host_context("storage-0"))
        loop.run_until_complete(asyncio.sleep(1.0))
        loop.kill_host("storage-0")
        end_leftovers(loop)
        assert len(seen) == 1 and isinstance(seen[0], asyncio.Task), seen
        assert loop.live_tasks() == set()
    finally:
        loop.close()
