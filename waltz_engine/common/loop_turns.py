"""How many times the running loop's selector returned: the loop's iterations (issue 33).

A request that crosses a node in fewer iterations costs less (each iteration is a ``select``
system call and a pass over the ready callbacks), so the server publishes the count as the gauge
``waltz-server.loop-iterations``, and ``waltz bench producers`` reports it per commit. Counted by
wrapping the selector of asyncio's selector loops; on another loop (uvloop) the count is None.

The counter also saves the server one of those iterations per lone commit
(:func:`call_at_turn_end`, :func:`run_turn_end`): work that waits for the end of the loop turn
(a batch that should take every append read in the turn) runs as soon as the turn's last
callback ends, instead of after one more ``select``.

And work that should gather a whole turn's output (:func:`call_before_select`: the feeds of
every partition a turn committed, to one client, in one write) runs once the turn's callbacks
are all done, right before the selector waits again: no iteration and no ``select`` more.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any


class LoopTurns:
    """Counts the selector returns of one loop from :func:`count_turns` on."""

    __slots__ = ("count", "tail", "tail_turn", "before_select")

    def __init__(self) -> None:
        self.count = 0
        # The latest handle of :func:`call_at_turn_end`, and the turn it was scheduled in.
        self.tail: asyncio.Handle | None = None
        self.tail_turn = -1
        # What :func:`call_before_select` gave, in order: run before the next ``select``.
        self.before_select: list[Callable[[], object]] = []


def call_before_select(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Run ``callback`` once this loop turn's callbacks are all done, right before the loop's
    selector waits for the next events (the end of the turn, with no iteration between); on a
    loop whose iterations are not counted (:func:`count_turns`: the simulator's, a test's),
    ``loop.call_soon(callback)``. From the loop's thread only.

    What the callback schedules (``call_soon``, a timer) runs as if scheduled in the turn: the
    selector does not wait past it."""
    turns: LoopTurns | None = getattr(loop, "_waltz_turns", None)
    if turns is None:
        loop.call_soon(callback)
    else:
        turns.before_select.append(callback)


def call_at_turn_end(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """``loop.call_soon(callback)``; a read callback that turns out to be the last of its loop
    turn may run it at once (:func:`run_turn_end`), which is the same order without the
    ``select`` between them."""
    handle = loop.call_soon(callback)
    turns: LoopTurns | None = getattr(loop, "_waltz_turns", None)
    if turns is not None:
        turns.tail = handle
        turns.tail_turn = turns.count


def run_turn_end(loop: asyncio.AbstractEventLoop) -> None:
    """Called by a read callback as it ends: when the only callback left to the loop is the one
    :func:`call_at_turn_end` scheduled in this very turn, run it now.

    It would run first in the next iteration anyway: asyncio runs the callbacks scheduled
    during a turn before those of the next ``select``'s events, so nothing could join or pass
    it; running it now only saves that ``select`` (a lone appender's request and its batch in
    one iteration). One scheduled in an earlier turn may still be due in this one (the loop
    counted it in this turn's callbacks), so it is left alone, as is any other state of the
    ready queue (several partitions, more events this turn: the end of the turn as before).
    What that callback scheduled so in its turn is run the same way after it (the batch's
    write to a replica that waits for the turn's end: ``FramedConnection.coalesce_writes``).
    """
    turns: LoopTurns | None = getattr(loop, "_waltz_turns", None)
    if turns is None or turns.tail is None:
        return  # (most reads: nothing waits for the turn's end, no look at the ready queue)
    ready: collections.deque[asyncio.Handle] | None = getattr(loop, "_ready", None)
    while turns.tail is not None:
        handle, turns.tail = turns.tail, None
        if turns.tail_turn != turns.count or handle.cancelled():
            return
        if ready is None or len(ready) != 1 or ready[0] is not handle:
            return
        ready.pop()
        handle._run()


def count_turns(loop: asyncio.AbstractEventLoop) -> LoopTurns | None:
    """Start counting ``loop``'s iterations (once per loop; the same counter after)."""
    selector: Any = getattr(loop, "_selector", None)
    if selector is None or not hasattr(selector, "select"):
        return None
    turns: LoopTurns | None = getattr(selector, "_waltz_turns", None)
    if turns is not None:
        return turns
    turns = LoopTurns()
    select = selector.select

    def counted_select(timeout: float | None = None) -> Any:
        if turns.before_select:
            timeout = _run_before_select(loop, turns, timeout)
        events = select(timeout)
        turns.count += 1
        return events

    selector.select = counted_select
    selector._waltz_turns = turns
    loop._waltz_turns = turns  # type: ignore[attr-defined]
    return turns


def _run_before_select(
    loop: asyncio.AbstractEventLoop, turns: LoopTurns, timeout: float | None
) -> float | None:
    """Runs the :func:`call_before_select` callbacks (those they add, too); the selector's
    timeout, shortened to what they scheduled."""
    while turns.before_select:
        callbacks, turns.before_select = turns.before_select, []
        for callback in callbacks:
            try:
                callback()
            except Exception as e:  # as a callback the loop runs: reported, the loop goes on
                loop.call_exception_handler({"message": "end-of-turn callback failed", "exception": e})
    ready: collections.deque[asyncio.Handle] | None = getattr(loop, "_ready", None)
    if ready:
        return 0
    scheduled: list[asyncio.TimerHandle] | None = getattr(loop, "_scheduled", None)
    if scheduled:
        due_s = max(0.0, scheduled[0].when() - loop.time())  # (a heap: its first is due first)
        return due_s if timeout is None else min(timeout, due_s)
    return timeout
