"""Waiting for a task to end never swallows the waiter's own cancellation."""

from __future__ import annotations

import asyncio

import pytest

from waltz_engine.common.tasks import wait_ended


def test_wait_ended_takes_the_tasks_end_whatever_it_is() -> None:
    asyncio.run(_takes_the_end())


async def _takes_the_end() -> None:
    async def fails() -> None:
        raise ValueError("its own error")

    failing = asyncio.create_task(fails())
    await wait_ended(failing)  # its error is its owner's to report
    never = asyncio.create_task(asyncio.Event().wait())
    never.cancel()
    await wait_ended(never)
    assert failing.done() and never.cancelled()


def test_a_waiter_cancelled_while_waiting_is_cancelled() -> None:
    asyncio.run(_cancelled_waiter())


async def _cancelled_waiter() -> None:
    # A server's stop cancels its assignment task while it waits for a store session to close:
    # the waiter must end, not wait on as if nothing happened.
    blocked = asyncio.create_task(asyncio.Event().wait())
    waiting = asyncio.Event()

    async def waiter() -> str:
        waiting.set()
        await wait_ended(blocked)
        return "went on"

    task = asyncio.create_task(waiter())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    blocked.cancel()
