"""Blocking calls into the client's event loop from other threads (SyncWaltzClient's methods,
``Transaction.get_data`` on a consumer thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from waltz_engine.client.errors import ClientClosedError

T = TypeVar("T")

# How often a blocked caller checks that the loop's thread still runs. A coroutine handed to a
# loop that stops before running it is never run: its caller would wait forever, and a consumer
# thread blocked so keeps the process from exiting (the executor's threads are joined at exit).
LOOP_CHECK_INTERVAL_S = 0.25


def call_on_loop(
    coroutine: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, thread: threading.Thread
) -> T:
    """Run ``coroutine`` on ``loop`` (driven by ``thread``) and wait for its result; once the
    loop's thread has ended, ClientClosedError instead of waiting forever."""
    if not thread.is_alive():
        coroutine.close()
        raise ClientClosedError()
    try:
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    except RuntimeError:  # the loop was closed meanwhile
        coroutine.close()
        raise ClientClosedError() from None
    while True:
        try:
            return future.result(LOOP_CHECK_INTERVAL_S)
        except TimeoutError:
            if not thread.is_alive() and not future.done():
                raise ClientClosedError() from None
