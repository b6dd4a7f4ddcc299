"""What a connection's read callback could not finish without waiting (issue 33).

The stream client handles a feed batch in the read callback that cut its frames, as far as
nothing waits: the feed's bookkeeping, the control messages and every ``apply_transaction`` that
returns nothing to await. At the first that does (a coroutine callback, one on an executor, a
partition's feed still applied elsewhere), the rest of the batch becomes an :class:`Unfinished`,
which the connection's reader task awaits, in order, as it awaited every batch before.

An :class:`Unfinished` may hold a partition's application lock (the callback returned something
to await with the lock taken). Awaiting it to its end releases the lock, as would a cancellation
while awaited; one never awaited (its connection closed first) must be discarded, which releases
it and ends what it held as a cancellation would have.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import Any


class Unfinished:
    """The rest of a batch: ``await`` it once, or ``discard()`` it."""

    __slots__ = ("_coroutine", "_discard")

    def __init__(
        self, coroutine: Coroutine[Any, Any, None], discard: Callable[[], None] | None = None
    ) -> None:
        self._coroutine = coroutine
        # What giving it up unstarted must undo (the coroutine's own `finally` does it once started).
        self._discard = discard

    def __await__(self) -> Generator[Any, None, None]:
        self._discard = None  # started: from here the coroutine releases what it holds
        return self._coroutine.__await__()

    def discard(self) -> None:
        """Give it up without running it (its connection is gone)."""
        self._coroutine.close()
        discard, self._discard = self._discard, None
        if discard is not None:
            discard()


async def raising(error: BaseException) -> None:
    """The error a read callback met, raised where the reader task would have met it."""
    raise error
