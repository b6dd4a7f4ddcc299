"""Why the product code waits with ``asyncio.timeout`` and never ``asyncio.wait_for``.

On Python 3.11 (our minimum), ``wait_for`` loses a cancellation of the waiting task when the
awaited thing completes in the same loop iteration: it returns the result and the CancelledError
is gone, so a task told to stop goes on (a shutdown hangs, a connection leaks after its opener was
cancelled). 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``, which does not have the bug.

The race is made deterministic with the loop's ordering: one callback completes the future and
cancels the waiter back to back, so both land before the waiter runs again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

PRODUCT_PACKAGES = ("waltz_engine", "waltz_cli", "spark")


async def _complete_and_cancel_together(wait: Callable[[asyncio.Future[int]], Awaitable[int]]) -> str:
    """Run ``wait(future)`` in a task, then complete the future and cancel the task in one step."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.create_task(wait(future))
    await asyncio.sleep(0)  # one turn: the task is now suspended inside wait(future)
    assert not waiting.done()
    future.set_result(7)
    waiting.cancel()
    try:
        return f"returned {await waiting}"
    except asyncio.CancelledError:
        return "cancelled"


async def _with_timeout(future: asyncio.Future[int]) -> int:
    async with asyncio.timeout(60):
        return await future


async def _with_no_limit(future: asyncio.Future[int]) -> int:
    async with asyncio.timeout(None):
        return await future


async def _with_wait_for(future: asyncio.Future[int]) -> int:
    return await asyncio.wait_for(future, 60)


@pytest.mark.parametrize("wait", [_with_timeout, _with_no_limit], ids=["timeout", "no-limit"])
def test_asyncio_timeout_keeps_a_cancellation_that_races_the_result(
    wait: Callable[[asyncio.Future[int]], Awaitable[int]],
) -> None:
    assert asyncio.run(_complete_and_cancel_together(wait)) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for is built on asyncio.timeout")
def test_wait_for_on_3_11_loses_a_cancellation_that_races_the_result() -> None:
    # The hazard itself: if this starts failing on 3.11, the stdlib changed, not our code.
    assert asyncio.run(_complete_and_cancel_together(_with_wait_for)) == "returned 7"


def test_product_code_does_not_use_wait_for() -> None:
    root = Path(__file__).resolve().parents[2]
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for package in PRODUCT_PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "asyncio.wait_for(" in line and not line.lstrip().startswith("#")
    ]
    assert offenders == [], "use `async with asyncio.timeout(...)` (3.11's wait_for loses cancellations)"
