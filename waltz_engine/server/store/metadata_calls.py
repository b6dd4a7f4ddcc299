r"""Blocking ZooKeeper calls of the store layer, run in a thread, with ZooKeeper's own failures
turned into :class:`MetadataUnavailableError`.

kazoo raises its own exceptions (``ConnectionLoss``, ``SessionExpiredError``...) while
ZooKeeper restarts or a session expires. They are not :class:`StoreError`\ s, so the store's
retry loops would let them through and end the task that called (a smoke run saw a
partition's append task die that way, and the partition hang); as ``StoreError``\ s they are
retried with backoff like any other unavailable dependency.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.server.store.errors import MetadataUnavailableError
from waltz_engine.zk.connection import describe

P = ParamSpec("P")
T = TypeVar("T")


async def metadata_call(what: str, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args, **kwargs)`` in a thread; a ZooKeeper failure raises MetadataUnavailableError."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except KazooTimeoutError as e:
        raise MetadataUnavailableError(f"{what}: ZooKeeper did not answer ({e})") from e
    except KazooException as e:
        raise MetadataUnavailableError(f"{what}: ZooKeeper unavailable ({describe(e)})") from e
