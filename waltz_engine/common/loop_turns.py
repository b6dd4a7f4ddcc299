"""How many times the running loop's selector returned: the loop's iterations (issue 33).

A request that crosses a node in fewer iterations costs less (each iteration is a ``select``
system call and a pass over the ready callbacks), so the server publishes the count as the gauge
``waltz-server.loop-iterations``, and ``waltz bench producers`` reports it per commit. Counted by
wrapping the selector of asyncio's selector loops; on another loop (uvloop) the count is None.
"""

from __future__ import annotations

import asyncio
from typing import Any


class LoopTurns:
    """Counts the selector returns of one loop from :func:`count_turns` on."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


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
    return turns
