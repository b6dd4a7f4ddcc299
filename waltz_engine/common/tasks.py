"""Stopping background tasks."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` and wait until it has ended. Its CancelledError is swallowed, but not a
    cancellation of the caller itself, which arrives as the same exception."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
