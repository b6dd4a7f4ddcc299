"""The loop-iteration counter and the end-of-turn work a read callback may run at once (issue 33)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from waltz_engine.common.loop_turns import LoopTurns, call_at_turn_end, count_turns, run_turn_end


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
        run_turn_end(loop)
        assert ran == []
        await asyncio.sleep(0)
        assert ran == ["ran"]

    _run(main())
