"""SessionBounds (pure unit tests; the ZooKeeper read is replaced by a function)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from waltz_engine.storage.node.session_bounds import (
    SessionBounds,
    SupersededSessionError,
    UnissuedSessionError,
)
from waltz_engine.zk.connection import ZooKeeperSettings

SLOW_READ_S = 0.3


class _Bounds(SessionBounds):
    """The znode's session id is ``self.issued_now``; a read takes SLOW_READ_S and sees the value
    at its start (as a read that reached ZooKeeper before a server's compare-and-set)."""

    def __init__(self) -> None:
        super().__init__(ZooKeeperSettings("127.0.0.1:1", "/unit"))
        self.issued_now = 5
        self.reads = 0
        self.started = threading.Event()

    def _read_znode(self, partition_id: int) -> int:
        seen = self.issued_now
        self.reads += 1
        self.started.set()
        time.sleep(SLOW_READ_S)
        return seen


def test_a_check_that_joins_an_older_read_asks_again_before_refusing() -> None:
    async def go() -> None:
        bounds = _Bounds()
        forged = asyncio.create_task(bounds.check(0, 1 << 62))  # starts a read that sees 5
        await asyncio.to_thread(bounds.started.wait)
        bounds.issued_now = 6  # a server's compare-and-set, then its LAST_SESSION_INFO:
        await bounds.check(0, 6)  # joined the old read ("5"), so it must read again: accepted
        with pytest.raises(UnissuedSessionError):
            await forged
        assert bounds.reads == 2

    asyncio.run(go())


def test_concurrent_checks_share_one_read_and_forged_ids_are_refused() -> None:
    async def go() -> None:
        bounds = _Bounds()
        results = await asyncio.gather(*(bounds.check(0, 7 + i) for i in range(50)), return_exceptions=True)
        assert all(isinstance(r, UnissuedSessionError) for r in results)
        assert bounds.reads == 1
        await bounds.check(0, 5)  # known now: no read
        assert bounds.reads == 1

    asyncio.run(go())


def test_a_forgotten_session_id_takes_only_the_latest_session_as_read_after_the_request() -> None:
    """``latest_only`` (a replica whose session id was reset: issue 32, the simulator's seed
    1156): a session ZooKeeper has issued but since superseded is a deposed writer's."""

    async def go() -> None:
        bounds = _Bounds()
        await bounds.check(0, 5)  # learns 5
        assert bounds.reads == 1
        with pytest.raises(SupersededSessionError, match="session id 4 of partition 0 was superseded"):
            await bounds.check(0, 4, latest_only=True)  # below what is known: no read
        assert bounds.reads == 1
        bounds.issued_now = 6  # a newer server's compare-and-set
        with pytest.raises(SupersededSessionError, match=r"superseded \(ZooKeeper's store session is 6\)"):
            await bounds.check(0, 5, latest_only=True)  # 5 was the latest known: asked again
        assert bounds.reads == 2
        await bounds.check(0, 6, latest_only=True)  # the latest, as read after it arrived
        assert bounds.reads == 3
        await bounds.check(0, 5)  # a replica that remembers its session: issued is enough
        assert bounds.reads == 3

    asyncio.run(go())
