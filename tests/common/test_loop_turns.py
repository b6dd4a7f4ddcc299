"""The loop-iteration counter and the end-of-turn work a read callback may run at once (issue 33)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from waltz_engine.common.loop_turns import (
    LoopTurns,
    call_at_turn_end,
    call_before_select,
    count_turns,
    run_turn_end,
)


def _run(main: Coroutine[Any, Any, None]) -> None:
    loop = asyncio.SelectorEventLoop()
    try:
        loop.run_until_complete(main)
    finally:
        loop.close()


def _counted_loop() -> tuple[asyncio.AbstractEventLoop, LoopTurns]:
    loop = asyncio.get_running_loop()
    turns = count_turns(loop)
    assert turns is not None
    return loop, turns


async def _at_the_end_of_a_read_callback(loop: asyncio.AbstractEventLoop, work: Callable[[], None]) -> int:
    """Schedule ``work`` at the turn's end from a socket's read callback that then ends its turn
    as ``SocketTransport._read_ready`` does (``run_turn_end``); the loop's count in that callback."""
    turns = count_turns(loop)
    assert turns is not None
    a, b = socket.socketpair()
    done = loop.create_future()

    def readable() -> None:
        b.recv(16)
        call_at_turn_end(loop, work)
        run_turn_end(loop)
        done.set_result(turns.count)

    loop.add_reader(b.fileno(), readable)
    a.send(b"x")
    try:
        return int(await done)
    finally:
        loop.remove_reader(b.fileno())
        a.close()
        b.close()


def test_the_last_callback_of_a_turn_runs_the_end_of_turn_work_without_another_select() -> None:
    async def main() -> None:
        loop, turns = _counted_loop()
        ran: list[int] = []
        at_read = await _at_the_end_of_a_read_callback(loop, lambda: ran.append(turns.count))
        # It ran in the read callback's own iteration, not after the next select.
        assert ran == [at_read]

    _run(main())


def test_end_of_turn_work_scheduled_by_end_of_turn_work_runs_in_the_same_turn() -> None:
    """The batch that starts at the end of a read callback's turn may write to a replica that
    waits for the turn's end too (``FramedConnection.coalesce_writes``): both run in the read
    callback's iteration, in order."""

    async def main() -> None:
        loop, turns = _counted_loop()
        ran: list[tuple[str, int]] = []

        def batch() -> None:
            ran.append(("batch", turns.count))
            call_at_turn_end(loop, lambda: ran.append(("flush", turns.count)))

        at_read = await _at_the_end_of_a_read_callback(loop, batch)
        assert ran == [("batch", at_read), ("flush", at_read)]

    _run(main())


def test_end_of_turn_work_waits_for_the_turn_when_other_callbacks_are_ready() -> None:
    async def main() -> None:
        loop, turns = _counted_loop()
        order: list[str] = []
        done = loop.create_future()

        def first() -> None:
            call_at_turn_end(loop, lambda: order.append("end of turn"))
            loop.call_soon(lambda: order.append("other"))
            run_turn_end(loop)  # two callbacks are ready: not the turn's end
            order.append("first done")
            loop.call_soon(lambda: done.set_result(None))

        loop.call_soon(first)
        await done
        assert order == ["first done", "end of turn", "other"]

    _run(main())


def test_end_of_turn_work_of_an_earlier_turn_is_left_to_the_loop() -> None:
    async def main() -> None:
        loop, turns = _counted_loop()
        ran: list[int] = []
        call_at_turn_end(loop, lambda: ran.append(turns.count))
        scheduled_in = turns.count
        await asyncio.sleep(0)  # a select: a new turn
        assert ran == [scheduled_in + 1]  # the loop ran it, once
        run_turn_end(loop)  # nothing left to run
        assert ran == [scheduled_in + 1]

    _run(main())


def test_without_a_counted_loop_the_work_runs_at_the_end_of_the_turn() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        call_at_turn_end(loop, lambda: ran.append("ran"))
        call_before_select(loop, lambda: ran.append("ran before select"))  # (a call_soon here)
        run_turn_end(loop)
        assert ran == []
        await asyncio.sleep(0)
        assert ran == ["ran", "ran before select"]

    _run(main())


def test_work_before_select_runs_after_the_turns_callbacks_without_another_iteration() -> None:
    async def main() -> None:
        loop, turns = _counted_loop()
        order: list[tuple[str, int]] = []
        done = loop.create_future()

        def first() -> None:
            call_before_select(loop, lambda: order.append(("before select", turns.count)))
            call_before_select(loop, lambda: order.append(("before select too", turns.count)))
            loop.call_soon(second)  # the next turn's
            order.append(("first", turns.count))

        def second() -> None:
            order.append(("second", turns.count))
            done.set_result(None)

        loop.call_soon(first)
        await done
        at = order[0][1]
        assert order == [
            ("first", at),
            ("before select", at),
            ("before select too", at),
            ("second", at + 1),
        ]

    _run(main())


def test_what_work_before_select_schedules_runs_without_waiting_for_an_event() -> None:
    async def main() -> None:
        loop, turns = _counted_loop()
        done = loop.create_future()
        # Nothing else is ready and no timer is near: the selector would block, but must not.
        call_before_select(loop, lambda: loop.call_soon(done.set_result, "soon"))
        assert await asyncio.wait_for(done, 5) == "soon"
        timed = loop.create_future()
        call_before_select(loop, lambda: loop.call_later(0.01, timed.set_result, "timer"))
        assert await asyncio.wait_for(timed, 5) == "timer"

    _run(main())
