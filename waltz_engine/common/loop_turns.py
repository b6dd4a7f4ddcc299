"""How many times the running loop's selector returned: the loop's iterations (issue 33).

A request that crosses a node in fewer iterations costs less (each iteration is a ``select``
system call and a pass over the ready callbacks), so the server publishes the count as the gauge
``waltz-server.loop-iterations``, and ``waltz bench producers`` reports it per commit. Counted by
wrapping the selector of asyncio's selector loops; on another loop (uvloop) the count is None.

The counter also saves the server one of those iterations per lone commit
(:func:`call_at_turn_end`, :func:`run_turn_end`): work that waits for the end of the loop turn
(a batch that should take every append read in the turn) runs as soon as the turn's last
callback ends, instead of after one more ``select``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any


class LoopTurns:
    """Counts the selector returns of one loop from :func:`count_turns` on."""

    __slots__ = ("count", "tail", "tail_turn")

    def __init__(self) -> None:
        self.count = 0
        # The latest handle of :func:`call_at_turn_end`, and the turn it was scheduled in.
        self.tail: asyncio.Handle | None = None
        self.tail_turn = -1


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
    if turns is None:
        return
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
        events = select(timeout)
        turns.count += 1
        return events

    selector.select = counted_select
    selector._waltz_turns = turns
    loop._waltz_turns = turns  # type: ignore[attr-defined]
    return turns
