"""A server process moves what it holds once started out of the garbage collector's sight
(``gc.freeze``): its frequent collections then walk only the objects made since (issue 33)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal

import pytest

from waltz_engine.common.process import serve_until_signalled


class _Service:
    def __init__(self) -> None:
        self.frozen_at_start = -1
        self.frozen_at_stop = -1

    async def start(self) -> None:
        self.frozen_at_start = gc.get_freeze_count()
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)  # served: stop

    async def stop(self) -> None:
        self.frozen_at_stop = gc.get_freeze_count()


@pytest.mark.parametrize("freeze_heap", [False, True])
def test_a_node_freezes_its_heap_once_started_only_when_asked(freeze_heap: bool) -> None:
    gc.unfreeze()
    service = _Service()
    try:
        assert asyncio.run(serve_until_signalled(service, freeze_heap)) == 0
    finally:
        gc.unfreeze()  # (the test process goes on as before)
    assert service.frozen_at_start == 0
    assert (service.frozen_at_stop > 0) == freeze_heap
