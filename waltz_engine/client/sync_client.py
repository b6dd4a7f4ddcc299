"""A blocking facade for threaded programs: the asyncio client on a loop in a background thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from waltz_engine.client.callbacks import WaltzClientCallbacks
from waltz_engine.client.client import WaltzClient
from waltz_engine.client.config import ConfigSource, client_config
from waltz_engine.client.loop_thread import call_on_loop
from waltz_engine.client.transaction_context import TransactionContext
from waltz_engine.common.metrics import MetricsRegistry

T = TypeVar("T")

# Joining the loop thread at close: the client's own close is bounded by its timeouts.
LOOP_THREAD_JOIN_TIMEOUT_S = 30.0
# A close given up (a second Ctrl-C): how long the loop gets to end its tasks cancelled.
ABANDONED_CLOSE_TIMEOUT_S = 2.0

log = logging.getLogger(__name__)


class SyncWaltzClient:
    """The client for threaded programs: ``with SyncWaltzClient(callbacks) as client:``.

    It starts when built (mounting every partition; ``config`` as for :class:`WaltzClient`: a
    :class:`~waltz_engine.client.config.WaltzClientConfig`, a YAML path, ``zookeeper`` and
    ``cluster_root``, or nothing next to a ``waltz dev up`` cluster). Its methods block, so call
    them from your threads, never from a callback. The callbacks and ``execute`` run on a pool of
    ``client.numConsumerThreads`` threads (the original's consumer threads), so they may block,
    e.g. on ``transaction.get_data()``; a partition's transactions are still applied one at a
    time, in order. The context hooks (``on_completion``, ``on_application``, ``on_exception``,
    ``on_lock_failure``) run on the client's loop thread: keep them short. Outcomes follow
    :class:`WaltzClient`'s contract; :meth:`flush` returns once every submitted context has its
    final outcome.
    """

    def __init__(
        self,
        callbacks: WaltzClientCallbacks,
        config: ConfigSource = None,
        metrics: MetricsRegistry | None = None,
        *,
        zookeeper: str | None = None,
        cluster_root: str | None = None,
    ) -> None:
        config = client_config(config, zookeeper, cluster_root)
        self._consumers = concurrent.futures.ThreadPoolExecutor(
            config.num_consumer_threads, thread_name_prefix="waltz-client-consumer"
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="waltz-client-loop", daemon=True)
        self._thread.start()
        self._client = WaltzClient(callbacks, config, callback_executor=self._consumers, metrics=metrics)
        try:
            self._run(self._client.start())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError(
                "SyncWaltzClient methods block; call them from your threads, not from callbacks"
            )
        return call_on_loop(coroutine, self._loop, self._thread)

    @property
    def async_client(self) -> WaltzClient:
        return self._client

    @property
    def client_id(self) -> int:
        return self._client.client_id

    @property
    def cluster_name(self) -> str:
        return self._client.cluster_name

    @property
    def num_partitions(self) -> int:
        return self._client.num_partitions

    def submit(self, context: TransactionContext) -> None:
        """Execute and send ``context`` (see :meth:`WaltzClient.submit`)."""
        self._run(self._client.submit(context))

    def flush(self) -> None:
        """Block until every submitted context has its final outcome (see :meth:`WaltzClient.flush`)."""
        self._run(self._client.flush())

    flush_transactions = flush

    def has_pending_transactions(self) -> bool:
        pending: bool = self._run(_call(self._client.has_pending_transactions))
        return pending

    def high_water_mark(self, partition_id: int) -> int:
        return self._run(self._client.high_water_mark(partition_id))

    get_high_water_mark = high_water_mark

    def set_partitions(self, partition_ids: Iterable[int]) -> None:
        self._run(self._client.set_partitions(partition_ids))

    def get_partitions(self) -> set[int]:
        return self._run(_call(self._client.get_partitions))

    def close(self) -> None:
        """Close the client (see :meth:`WaltzClient.close`) and stop its loop; returns once no
        callback runs on a consumer thread (the one being applied ends first).

        A Ctrl-C while it waits (a program's second one, the first having ended its work) gives
        the graceful close up instead of raising: the client's tasks are cancelled and awaited
        on its loop, which then stops; undecided transactions' outcomes stay unknown.
        """
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        except KeyboardInterrupt:
            log.warning("Waltz client close interrupted: not waiting for it to finish")
            self._cancel_tasks()
        finally:
            self._stop_loop()

    def _cancel_tasks(self) -> None:
        """Cancel every task on the loop and let them end (bounded; a further Ctrl-C ends the wait)."""
        if not self._thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(_cancel_all(ABANDONED_CLOSE_TIMEOUT_S), self._loop)
        try:
            done.result(ABANDONED_CLOSE_TIMEOUT_S * 2)
        except (KeyboardInterrupt, concurrent.futures.TimeoutError):
            done.cancel()

    def __enter__(self) -> SyncWaltzClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(LOOP_THREAD_JOIN_TIMEOUT_S)
        self._loop.close()
        # Waits for the callbacks running on the consumer threads (queued ones are cancelled):
        # once close() returns none runs, so the application may close what they use. Without
        # the wait a DB-API callbacks' close() closed an SQLite connection a consumer thread was
        # still applying a transaction with (a segfault in a full-suite run). A callback that
        # calls into the stopped client gets ClientClosedError, so the wait is its own work.
        self._consumers.shutdown(wait=True, cancel_futures=True)


async def _cancel_all(timeout_s: float) -> None:
    """Cancel the loop's other tasks and wait (at most ``timeout_s``) for them to end, and for
    those their ending starts: a network client's task cancelled here starts its reconnect in its
    ``finally``, which was left pending, ran on until the loop stopped, and was destroyed there
    ("Task was destroyed but it is pending!", then a traceback from its own ``finally``)."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    deadline_s = loop.time() + timeout_s
    while tasks := [task for task in asyncio.all_tasks() if task is not me]:
        remaining_s = deadline_s - loop.time()
        if remaining_s <= 0:
            return
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=remaining_s)


async def _call(function: Any) -> Any:
    """Run a plain method on the loop thread, where the client's state lives."""
    return function()
