"""The determinism seams: the code the simulator runs reads time through the running loop, and
backoff jitter comes from the loop's seeded generator."""

from __future__ import annotations

import asyncio
import random
import re
import time

from testkit import REPO_ROOT

from waltz_engine.common import clock
from waltz_engine.common.backoff import Backoff
from waltz_engine.sim.loop import START_MONOTONIC_S, START_WALL_NS, SimLoop, run
from waltz_engine.storage.constants import now_ms

# The packages whose code runs inside the simulator; common/clock.py is the one place that reads the OS.
SIMULATED = ("waltz_engine/storage", "waltz_engine/server", "waltz_engine/client", "waltz_engine/common")
CLOCK_READ = re.compile(r"\btime\.(monotonic|monotonic_ns|time|time_ns|perf_counter|perf_counter_ns)\(")


def test_on_the_simulator_every_clock_is_virtual() -> None:
    async def main() -> tuple[float, int, int, int]:
        await asyncio.sleep(90)
        return clock.monotonic_s(), clock.monotonic_ns(), clock.wall_ms(), now_ms()

    (monotonic_s, monotonic_ns, wall_ms, header_ms), _ = run(1, main)
    assert monotonic_s == START_MONOTONIC_S + 90
    assert monotonic_ns == round((START_MONOTONIC_S + 90) * 1e9)
    assert wall_ms == header_ms == START_WALL_NS // 1_000_000 + 90_000


def test_elsewhere_the_clocks_are_the_real_ones() -> None:
    before_s, before_wall_ns = time.monotonic(), time.time_ns()
    off_loop = clock.monotonic_s(), clock.wall_ns()

    async def on_loop() -> tuple[float, float, int]:
        return asyncio.get_running_loop().time(), clock.monotonic_s(), clock.wall_ns()

    loop_time_s, on_loop_s, on_loop_wall_ns = asyncio.run(on_loop())
    after_s, after_wall_ns = time.monotonic(), time.time_ns()
    assert before_s <= off_loop[0] <= loop_time_s <= on_loop_s <= after_s
    assert before_wall_ns <= off_loop[1] <= on_loop_wall_ns <= after_wall_ns


def test_simulated_code_reads_no_clock_but_the_seam() -> None:
    readers = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for package in SIMULATED
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        if path.name != "clock.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if CLOCK_READ.search(line)
    ]
    assert readers == [], "read the time through waltz_engine.common.clock (the simulator's seam)"


def test_backoff_jitter_comes_from_the_simulators_generator() -> None:
    async def delays() -> list[float]:
        backoff = Backoff(100, 10_000, jitter=0.5)
        return [backoff.next_delay_ms() for _ in range(5)]

    first, second, other = (run(seed, delays)[0] for seed in (3, 3, 4))
    assert first == second != other
    expected = random.Random(3)
    interval_ms = 100.0
    for delay_ms in first:
        assert delay_ms == min(interval_ms * (0.5 + expected.random()), 10_000)
        interval_ms *= 2


def test_the_real_clock_is_read_directly_only_while_no_simulator_loop_is_open() -> None:
    async def on_loop() -> float:
        return clock.monotonic_s()

    opened = clock._own_clock_loops
    _, loop = run(1, on_loop)
    assert loop.is_closed()
    assert clock._own_clock_loops == opened  # closed: told once
    loop.close()  # a second close tells nothing more
    assert clock._own_clock_loops == opened
    sim = SimLoop(2)
    try:
        assert clock._own_clock_loops == opened + 1
        # Another loop (a real one) beside an open simulator loop reads the real clock.
        before_s = time.monotonic()
        assert before_s <= asyncio.run(on_loop()) <= time.monotonic()
        # And the simulator's loop its virtual one.
        assert sim.run_until_complete(on_loop()) == START_MONOTONIC_S
    finally:
        sim.close()
    assert clock._own_clock_loops == opened
