"""Work that must wait for the appends queued before it, without holding up the appends after it.

A mount is answered with the partition's high-water mark once every append queued before it is
decided (committed with a txid, or certainly absent), so the feed that ends in READY holds those
transactions and a client may take every earlier append of its own that the feed does not show as
failed; a flush likewise. An append whose outcome is unknown (its store future raised: nobody will
decide it here) is never decided: the work behind it waits until the partition closes and drops
it, and the clients learn the outcome from the server whose recovery decides it.

The original flushes the store on the partition's append thread for each of them, and no append
behind them reaches the store meanwhile: a storm of mounts stalls the writers, and the mounts are
answered one store round trip at a time.

Here the append task only notes how many appends it had handed to the store when it reached a
mount or a flush, and goes on. Appends are numbered as they are handed over; when the oldest
undecided one is decided, every waiter all of whose appends are now decided runs, together, in
one batch (a storm of mounts between two appends is one batch).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

Work = Callable[[], None]


class AppendBarrier:
    """Appends by number as handed to the store; work waiting for all those before it."""

    __slots__ = ("_issued", "_undecided", "_decided_early", "_waiting", "_num_waiting", "_undecidable")

    def __init__(self) -> None:
        self._issued = 0
        self._undecided: deque[int] = deque()  # append numbers not decided yet, oldest first
        self._decided_early: set[int] = set()  # decided while an older one was not
        # (number of appends before it, work in arrival order), by that number ascending.
        self._waiting: deque[tuple[int, list[Work]]] = deque()
        self._num_waiting = 0
        self._undecidable = 0  # appends whose outcome this partition will never learn

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_undecided(self) -> int:
        return len(self._undecided)

    def issue(self) -> int:
        """The number of an append just handed to the store; :meth:`decide` it exactly once."""
        number = self._issued
        self._issued += 1
        self._undecided.append(number)
        return number

    def after_issued(self, work: Work) -> bool:
        """Runs ``work`` now when every append issued so far is decided (True), else once they are."""
        if not self._undecided:
            work()
            return True
        waiting = self._waiting
        if waiting and waiting[-1][0] == self._issued:
            waiting[-1][1].append(work)
        else:
            waiting.append((self._issued, [work]))
        self._num_waiting += 1
        return False

    def decide(self, number: int) -> None:
        """Append ``number`` is decided; runs the waiting work whose appends all are."""
        undecided = self._undecided
        assert number < self._issued and number not in self._decided_early, number
        if not undecided or undecided[0] != number:
            self._decided_early.add(number)
            return
        undecided.popleft()
        while undecided and undecided[0] in self._decided_early:
            self._decided_early.remove(undecided.popleft())
        # Every append numbered below this one is decided.
        decided_below = undecided[0] if undecided else self._issued
        waiting = self._waiting
        while waiting and waiting[0][0] <= decided_below:
            _, batch = waiting.popleft()
            self._num_waiting -= len(batch)
            for work in batch:
                try:
                    work()
                except Exception:
                    # One failed answer must not keep the rest of the batch waiting.
                    log.exception("work waiting for appends failed")

    def undecidable(self, number: int) -> None:
        """Append ``number`` may or may not commit, and this partition will never know: the work
        waiting behind it stays waiting (until :meth:`clear`)."""
        assert number < self._issued and number not in self._decided_early, number
        self._undecidable += 1

    @property
    def num_undecidable(self) -> int:
        return self._undecidable

    def clear(self) -> None:
        """Drops the waiting work (the partition closed: nobody is served any more)."""
        self._waiting.clear()
        self._num_waiting = 0
