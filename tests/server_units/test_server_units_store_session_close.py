"""A store session whose opening coroutine is closed (its task destroyed pending; in the
simulator, a dead server's coroutine buried after the run) closes: GeneratorExit passes through,
not made a StoreError, which the store partition's retry loop took for a failed recovery and
retried in the closing coroutine."""

from __future__ import annotations

import asyncio
from typing import Any

from waltz_engine.server.store.config import StoreConfig
from waltz_engine.server.store.latency_router import LatencyWeightedRoute
from waltz_engine.server.store.store_session import StoreSession


class _ReplicaSession(LatencyWeightedRoute):
    def __init__(self) -> None:
        super().__init__()
        self.replica_id = "replica"
        self.close_calls = 0

    def close(self, cause: BaseException | None = None) -> None:
        self.close_calls += 1


class _Recovery:
    """A recovery whose metadata never loads (the store session's open waits in it)."""

    def __init__(self, waits_for: asyncio.Future[None]) -> None:
        self._waits_for = waits_for

    async def start(self) -> None:
        await self._waits_for

    def abort(self, cause: BaseException) -> None:
        pass


def test_a_closed_opening_coroutine_closes_its_session_and_ends() -> None:
    loop = asyncio.new_event_loop()
    try:
        replica = _ReplicaSession()
        session = StoreSession(0, 1, 5, StoreConfig(), [replica], None, "/r")  # type: ignore[list-item]
        recovery: Any = _Recovery(loop.create_future())
        session._recovery = recovery
        opening = session.open()
        opening.send(None)  # (it waits in the recovery's start)
        opening.close()  # (before: raised the StoreError it made of GeneratorExit)
        assert replica.close_calls == 1
    finally:
        loop.close()
