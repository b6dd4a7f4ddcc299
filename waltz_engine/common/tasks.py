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
        _raise_if_cancelling()


async def wait_ended(task: asyncio.Task[None]) -> None:
    """Wait until ``task`` has ended however it ends (its error is its own owner's to report),
    but let a cancellation of the caller itself through: swallowing it would leave a stopping
    caller running on (a server's stop waited forever for its assignment task)."""
    try:
        await task
    except asyncio.CancelledError:
        _raise_if_cancelling()
    except Exception:
        pass


def _raise_if_cancelling() -> None:
    current = asyncio.current_task()
    if current is not None and current.cancelling():
        raise asyncio.CancelledError
