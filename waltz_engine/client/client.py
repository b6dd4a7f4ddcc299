"""The application's entry point (the original's ``WaltzClient``, §3.1), asyncio-native.

One event loop runs everything: the stream client (mount, feed, appends), the RPC client
(transaction data, high-water marks), the retry workers (``client.numTransactionRetryThreads``
tasks re-executing contexts whose attempt was proven absent) and each partition's long-wait
timer. Application callbacks run on the loop unless a ``callback_executor`` is given
(SyncWaltzClient gives its consumer thread pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from typing import Any, TypeVar

from waltz_engine.client.callbacks import WaltzClientCallbacks
from waltz_engine.client.config import ConfigSource, client_config
from waltz_engine.client.driver import DriverInfo, WaltzClientDriver, ZooKeeperDriver
from waltz_engine.client.errors import (
    ClientClosedError,
    ClientTimeoutError,
    InvalidOperationError,
    OutcomeUnknownError,
    WaltzClientError,
)
from waltz_engine.client.network_client import Endpoint
from waltz_engine.client.partition import Partition, PartitionState, call_hook
from waltz_engine.client.rpc_client import RpcClient
from waltz_engine.client.stream_client import StreamClient
from waltz_engine.client.transaction import Transaction
from waltz_engine.client.transaction_builder import TransactionBuilder
from waltz_engine.client.transaction_context import TransactionContext
from waltz_engine.client.transaction_monitor import TransactionFuture
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.metrics import MetricsRegistry
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.transport import ASYNCIO_NETWORK, Network
from waltz_engine.zk.connection import ZooKeeperConnector, new_client
from waltz_engine.zk.payloads import PartitionInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

METRIC_GROUP = "waltz-client"


class WaltzClient:
    """The asyncio client: start it (``async with WaltzClient(callbacks) as client``, or
    ``await WaltzClient.create(...)``), then ``await client.submit(context)``.

    ``config``: a :class:`WaltzClientConfig`, a client YAML path, or None to use ``zookeeper`` and
    ``cluster_root`` or, without them, the nearest ``waltz dev up`` cluster
    (:meth:`WaltzClientConfig.load`). Every method is a coroutine or a plain method of the loop
    the client was started on; call them from that loop only (:class:`SyncWaltzClient` is for
    threads). Callbacks run on that loop too, unless ``callback_executor`` is given.

    The outcome contract, per submitted context: exactly one final outcome, through its hooks.
    ``on_completion(True)``: committed (the feed carried it; ``on_application`` follows once
    ``apply_transaction`` applied it). ``on_completion(False)``: certainly not in the log
    (``execute`` declined, a lock failure or another proof of absence with no retry left to
    run). ``on_exception(OutcomeUnknownError)``: the client closed or gave up while a server
    could still commit it; the feed shows whether it did. ``on_exception(other)``: raised before
    anything was sent (also raised by :meth:`submit`). An attempt is retried (re-executed with a
    fresh builder) only once a server proved it absent, never while it might still commit.
    """

    def __init__(
        self,
        callbacks: WaltzClientCallbacks,
        config: ConfigSource = None,
        *,
        zookeeper: str | None = None,
        cluster_root: str | None = None,
        callback_executor: Executor | None = None,
        metrics: MetricsRegistry | None = None,
        network: Network = ASYNCIO_NETWORK,
        zk_connector: ZooKeeperConnector = new_client,
    ) -> None:
        config = client_config(config, zookeeper, cluster_root)
        self._callbacks = callbacks
        self.config = config
        self._executor = callback_executor
        self._metrics = metrics
        self._driver: WaltzClientDriver = (
            config.mock_driver
            if config.mock_driver is not None
            else ZooKeeperDriver(
                config.zookeeper,  # type: ignore[arg-type]
                config.tls,
                config.endpoint_overrides,
                network,
                zk_connector,
            )
        )
        self._info: DriverInfo | None = None
        self._stream: StreamClient | None = None
        self._rpc: RpcClient | None = None
        self._early_endpoints: dict[Endpoint, list[PartitionInfo]] | None = None
        self._early_removed: list[Endpoint] = []
        # Contexts to try again, each with the count of its retries in a row that could not be sent.
        self._retry_queue: asyncio.Queue[tuple[TransactionContext, int]] = asyncio.Queue()
        self._open_contexts = 0  # submitted and without their final outcome yet (retries too)
        # Set and dropped at each change; made only when a flush waits (most changes have no waiter).
        self._progress: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def create(
        cls, callbacks: WaltzClientCallbacks, config: ConfigSource = None, **kwargs: Any
    ) -> WaltzClient:
        """A started client (see the class for ``config`` and the keyword arguments)."""
        client = cls(callbacks, config, **kwargs)
        await client.start()
        return client

    async def __aenter__(self) -> WaltzClient:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        assert self._info is None, "start() once"
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.current_thread()
        try:
            self._info = await self._driver.start(self._on_endpoints, self._on_server_removed)
            self._build_clients(self._info)
            if self.config.auto_mount:
                for partition_id in range(self._info.num_partitions):
                    await self._activate(partition_id)
            if self._early_endpoints is not None:
                self._on_endpoints(self._early_endpoints)
            for endpoint in self._early_removed:
                self._on_server_removed(endpoint)
        except BaseException:
            await self.close()
            raise
        for worker in range(self.config.num_transaction_retry_threads):
            self._tasks.append(asyncio.create_task(self._retry_worker(), name=f"waltz-client-retry-{worker}"))
        self._register_metrics()

    def _build_clients(self, info: DriverInfo) -> None:
        config = self.config
        self._rpc = RpcClient(
            info.client_id,
            info.num_partitions,
            self._driver.open_channel,
            config.reconnect_delay_ms,
            config.rpc_timeout_ms,
            config.reconnect_max_delay_ms,
            config.data_prefetch_bytes,
        )
        prefetching = config.data_prefetch_bytes > 0
        stream = self._stream = StreamClient(
            info.client_id,
            info.num_partitions,
            config.max_concurrent_transactions,
            self._driver.open_channel,
            config.reconnect_delay_ms,
            config.not_ready_retry_ms,
            self._deliver,
            self._rpc.get_high_water_mark,
            self._report_application_error,
            config.reconnect_max_delay_ms,
            config.max_application_attempts,
            self._rpc.feed_seen if prefetching else None,
            self._rpc.reset_prefetch if prefetching else None,
            config.long_wait_threshold_ms,
        )
        for partition in stream.partitions.values():
            partition.applied_listener = self._notify_progress

    async def close(self) -> None:
        """Release connections and ZooKeeper; every open context gets its final outcome.

        Contexts waiting for a retry were proven absent: ``on_completion(False)``. Appends no
        server has decided yet may still commit: ``on_exception(OutcomeUnknownError)``. Call
        :meth:`flush` first to have them decided.
        """
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self._retry_queue.empty():
            self._finish(self._retry_queue.get_nowait()[0], False)
        if self._stream is not None:
            await self._stream.close()
            await asyncio.sleep(0)  # the monitors' futures' done callbacks report the unknown outcomes
        if self._rpc is not None:
            await self._rpc.close()
        with contextlib.suppress(WaltzError, OSError):
            await self._driver.close()
        if self._metrics is not None:
            self._metrics.remove_group(METRIC_GROUP)
            for partition_id in range(self._info.num_partitions if self._info is not None else 0):
                self._metrics.remove_group(_partition_metric_group(partition_id))

    # -- identity --------------------------------------------------------------------------

    @property
    def client_id(self) -> int:
        return self._started().client_id

    @property
    def cluster_name(self) -> str:
        return self._started().cluster_name

    @property
    def num_partitions(self) -> int:
        return self._started().num_partitions

    @property
    def rpc_client(self) -> RpcClient:
        self._started()
        assert self._rpc is not None
        return self._rpc

    # -- transactions ----------------------------------------------------------------------

    async def submit(self, context: TransactionContext) -> None:
        """Execute ``context`` and send its transaction; the outcome arrives through its hooks.

        Returns once the append is sent (or declined). Raises, after ``on_exception``, when it
        cannot be sent at all: inactive partition, no mount within the timeout, client closed.
        The context then ends there: nothing of it was sent. Otherwise it ends in exactly one of
        ``on_completion(True)``, ``on_completion(False)`` or ``on_exception(OutcomeUnknownError)``
        (see :class:`~waltz_engine.client.transaction_context.TransactionContext`).
        """
        self._open_contexts += 1
        await self._attempt(context)

    async def _attempt(self, context: TransactionContext, unsent_retries: int | None = None) -> None:
        """One attempt of an open context; its final outcome, or a retry, comes later.

        ``unsent_retries``: for the client's own retry, how many retries of this context in a row
        could not be sent. A retry is of a context proven absent, which the application handed
        over for good; one the cluster did not serve within a bound (a mount, or room among the
        pending appends: a failover in progress) goes back to the queue instead of failing, up to
        ``max_unsent_retries`` times. Nothing of such an attempt was sent, so nothing can commit twice.

        Issue 33: an attempt that finds its partition mounted, an ``execute`` that returns its
        answer (no executor, no coroutine) and room in the monitor with no append waiting for
        it before this one runs straight through: no await suspends, no coroutine is made below
        this one, and the send buffer is waited on only above its low-water mark. Each wait
        the fast path skips is still taken, in the same order, when it is needed.
        """
        sent = False
        try:
            stream = self._stream
            if stream is None or self._closed:
                stream = self._stream_client()  # raises: not started, or closed
            partition_id = context.partition_id(stream.num_partitions)
            partition = stream.partitions.get(partition_id)
            if partition is None:
                partition = stream.partition(partition_id)  # raises PartitionNotFoundError
            if not partition.mounted or partition.state is not PartitionState.ACTIVE:
                await partition.ensure_mounted(self.config.ensure_mounted_timeout_ms, stream.check_ahead)
            # The client HWM as cached now (PR #67): what the server checks the locks against.
            builder = TransactionBuilder(partition.next_req_id(), partition.client_high_water_mark)
            # (``_call``'s no-executor case written out: a call less per submit)
            executed = (
                context.execute(builder) if self._executor is None else self._call(context.execute, builder)
            )
            if executed is not True and executed is not False and inspect.isawaitable(executed):
                executed = await executed
            if not executed:
                self._finish(context, False)  # execute declined: nothing to do, no retry
                return
            request = builder.build_request()
            future = partition.append_now(request, context)
            if future is None:  # the monitor is full, or appends wait for room before this one
                future = await stream.append(
                    request, context, self.config.registration_timeout_ms, self.config.flush_timeout_ms
                )
            sent = True
            future.add_done_callback(self._on_result)  # the future holds the context
            if self._progress is not None:  # a flush waits (a call saved per submit otherwise)
                self._notify_progress()
            network_client = partition.network_client
            if network_client is not None and network_client.must_drain:
                await network_client.drain()
        except asyncio.CancelledError:
            if not sent:
                self._finish(context, False)  # nothing of this attempt was sent, none will be
            raise
        except ClientTimeoutError as e:
            if sent:
                raise
            if (
                unsent_retries is not None
                and unsent_retries < self.config.max_unsent_retries
                and not self._closed
            ):
                log.info(
                    "a retry could not be sent (%s); trying again (%d of %d)",
                    e,
                    unsent_retries + 1,
                    self.config.max_unsent_retries,
                )
                self._retry_queue.put_nowait((context, unsent_retries + 1))
                return
            self._finish(context, e)
            raise
        except Exception as e:
            if not sent:
                self._finish(context, e)
            raise

    def _on_result(self, future: TransactionFuture) -> None:
        """An attempt was decided: the context's final outcome, or (proven absent) a retry."""
        context = future.context
        assert context is not None, "a submitted attempt's future holds its context"
        if future.cancelled():
            self._finish(context, OutcomeUnknownError(future.req_id, "the client stopped watching it"))
            return
        error = future.exception()
        if error is not None:
            self._finish(context, error)
        elif future.result():
            # on_completion(True) was called when the feed delivered it (before on_application).
            self._finish(context, None)
        elif self._closed or self.config.num_transaction_retry_threads == 0:
            self._finish(context, False)
        else:
            self._retry_queue.put_nowait((context, 0))
            self._notify_progress()

    def _finish(self, context: TransactionContext, outcome: bool | BaseException | None) -> None:
        """The context's one final outcome: a hook (None: the feed already called it)."""
        self._open_contexts -= 1
        if outcome is None:  # committed, the commonest: the feed called on_completion(True)
            pass
        elif isinstance(outcome, BaseException):
            call_hook(context.on_exception, outcome)
        else:
            call_hook(context.on_completion, outcome)
        if self._progress is not None:
            self._notify_progress()

    def _notify_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.set()

    async def _retry_worker(self) -> None:
        while True:
            context, unsent_retries = await self._retry_queue.get()
            # Failures were reported through the context's hooks, the application's own errors
            # too: none may end the worker (the retries after it would wait forever).
            with contextlib.suppress(Exception):
                await self._attempt(context, unsent_retries)

    async def flush(self) -> None:
        """Return once every context submitted so far has its final outcome, retries included,
        and the committed ones were applied (``apply_transaction`` returned for them).

        Asks the servers to decide every pending append and waits for the retries that follow;
        raises ClientTimeoutError after ``flush_timeout_ms`` with contexts still open (the
        original's ``while client.has_pending_transactions(): client.flush()`` keeps working).
        """
        stream = self._stream_client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.flush_timeout_ms / 1000
        asked: dict[int, ReqId] = {}  # the last append each partition's server was asked about
        while self.has_pending_transactions() or any(
            p.own_commit_unapplied for p in stream.partitions.values()
        ):
            progress = self._progress
            if progress is None:
                progress = self._progress = asyncio.Event()
            for partition in stream.partitions.values():
                last = partition.monitor.last_enqueued()
                if (
                    partition.is_active
                    and last is not None
                    and asked.get(partition.partition_id) != last.req_id
                ):
                    await partition.ensure_mounted(self.config.ensure_mounted_timeout_ms, stream.check_ahead)
                    partition.flush_async()
                    asked[partition.partition_id] = last.req_id
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ClientTimeoutError(
                    f"{self._open_contexts} transactions still undecided (or not yet applied) after "
                    f"{self.config.flush_timeout_ms} ms of flushing; is every partition's server up?"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await progress.wait()

    flush_transactions = flush

    def has_pending_transactions(self) -> bool:
        """Whether a submitted context has no final outcome yet (waiting retries count)."""
        return self._open_contexts > 0 or self._stream_client().has_pending_transactions

    async def high_water_mark(self, partition_id: int) -> int:
        """The server's high-water mark of ``partition_id`` (RPC)."""
        self._check_partition_id(partition_id)
        return await self.rpc_client.get_high_water_mark(partition_id)

    get_high_water_mark = high_water_mark

    # -- partitions ------------------------------------------------------------------------

    async def set_partitions(self, partition_ids: Iterable[int]) -> None:
        """Work with exactly these partitions (only with ``client.autoMount`` false)."""
        if self.config.auto_mount:
            raise InvalidOperationError("set_partitions needs client.autoMount=false")
        wanted = set(partition_ids)
        for partition_id in wanted:
            self._check_partition_id(partition_id)
        stream = self._stream_client()
        for partition in stream.partitions.values():
            if partition.is_active and partition.partition_id not in wanted:
                await partition.deactivate(self.config.flush_timeout_ms)
        for partition_id in sorted(wanted):
            if not stream.partitions[partition_id].is_active:
                await self._activate(partition_id)

    def get_partitions(self) -> set[int]:
        return {p.partition_id for p in self._stream_client().partitions.values() if p.is_active}

    async def ensure_mounted(self, partition_id: int) -> None:
        """Wait until the active ``partition_id`` is mounted (caught up to the server's
        high-water mark at the mount); ClientTimeoutError after ``client.ensureMountedTimeout``."""
        stream = self._stream_client()
        partition = stream.partition(partition_id)
        await partition.ensure_mounted(self.config.ensure_mounted_timeout_ms, stream.check_ahead)

    def stream_connected(self, partition_id: int) -> bool:
        """Whether the stream connection to the server of ``partition_id`` is up (so a mount
        of it is sent at once)."""
        network_client = self._stream_client().network_client_of(partition_id)
        return network_client is not None and network_client.ready

    async def _activate(self, partition_id: int) -> None:
        stream = self._stream_client()
        high_water_mark = self._call(self._callbacks.get_client_high_water_mark, partition_id)
        if inspect.isawaitable(high_water_mark):
            high_water_mark = await high_water_mark
        partition = stream.partitions[partition_id]
        partition.activate(int(high_water_mark))
        stream.mount(partition)

    def _check_partition_id(self, partition_id: int) -> None:
        self._stream_client().partition(partition_id)  # raises PartitionNotFoundError

    # -- driver callbacks ------------------------------------------------------------------

    def _on_endpoints(self, endpoints: dict[Endpoint, list[PartitionInfo]]) -> None:
        if self._stream is None or self._rpc is None:
            self._early_endpoints = endpoints
            return
        self._rpc.set_endpoints(endpoints)
        self._stream.set_endpoints(endpoints)

    def _on_server_removed(self, endpoint: Endpoint) -> None:
        if self._stream is None or self._rpc is None:
            self._early_removed.append(endpoint)
            return
        self._rpc.remove_server(endpoint)
        self._stream.remove_server(endpoint)

    # -- application callbacks -------------------------------------------------------------

    def _deliver(self, transaction_id: int, header: int, req_id: ReqId) -> Awaitable[None] | None:
        """Hand one transaction to the application; what it raises the stream client handles.

        A plain callback on the loop runs now (None: nothing to await, no coroutine per
        transaction); a coroutine callback or one on the executor is returned to be awaited.
        """
        assert self._rpc is not None and self._loop is not None and self._loop_thread is not None
        transaction = Transaction(transaction_id, header, req_id, self._rpc, self._loop, self._loop_thread)
        apply = self._callbacks.apply_transaction
        # (``_call``'s no-executor case written out: a call less per transaction)
        result = apply(transaction) if self._executor is None else self._call(apply, transaction)
        return result if result is not None and inspect.isawaitable(result) else None

    def _report_application_error(
        self, partition_id: int, transaction_id: int, exception: BaseException
    ) -> None:
        """Every failed try of apply_transaction; a PartitionStoppedError when the client gave up."""
        self._callbacks.uncaught_exception(partition_id, transaction_id, exception)

    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call an application callback: its result, or an awaitable of its result.

        With no executor the callback runs here, on the loop: what it returns comes back as it
        is, a plain result (no coroutine made: a lone submit and a feed's transaction stay
        synchronous) or the awaitable a coroutine callback made. With an executor what comes back
        is an awaitable of its result that runs it there once awaited (a coroutine it returned
        is awaited on the loop). The caller awaits what is awaitable.
        """
        if self._executor is None:
            return function(*args)
        return self._on_executor(self._executor, function, *args)

    @staticmethod
    async def _on_executor(executor: Executor, function: Callable[..., Any], *args: Any) -> Any:
        """``function`` on ``executor`` once awaited, not before (an abandoned feed step closes
        it unstarted, so its transaction is not applied); a coroutine it returns runs here."""
        result = await asyncio.get_running_loop().run_in_executor(executor, function, *args)
        if inspect.isawaitable(result):
            result = await result
        return result

    # -- helpers ---------------------------------------------------------------------------

    def _started(self) -> DriverInfo:
        if self._closed:
            raise ClientClosedError()
        if self._info is None:
            raise WaltzClientError("the client is not started: use 'await WaltzClient.create(...)'")
        return self._info

    def _stream_client(self) -> StreamClient:
        self._started()
        assert self._stream is not None
        return self._stream

    def _register_metrics(self) -> None:
        registry, stream, info = self._metrics, self._stream, self._info
        if registry is None or stream is None or info is None:
            return
        registry.gauge(METRIC_GROUP, "cluster-name", lambda: info.cluster_name)
        registry.gauge(METRIC_GROUP, "client-id", lambda: info.client_id)
        registry.gauge(METRIC_GROUP, "num-active-partitions", lambda: len(self.get_partitions()))
        registry.gauge(METRIC_GROUP, "active-partition-ids", lambda: sorted(self.get_partitions()))
        registry.gauge(METRIC_GROUP, "stream-reconnects", lambda: stream.reconnects)
        for partition in stream.partitions.values():
            _register_partition_metrics(registry, partition)


def _partition_metric_group(partition_id: int) -> str:
    return f"{METRIC_GROUP}-stream.partition-{partition_id}"


def _register_partition_metrics(registry: MetricsRegistry, partition: Partition) -> None:
    group = _partition_metric_group(partition.partition_id)
    registry.gauge(group, "is-mounted", lambda: partition.mounted)
    registry.gauge(group, "is-partition-active", lambda: partition.is_active)
    registry.gauge(group, "high-water-mark", lambda: partition.client_high_water_mark)
    registry.gauge(group, "num-registered-transactions", lambda: partition.monitor.registered_count)
    registry.gauge(group, "lock-failure", lambda: partition.lock_failures)
    registry.gauge(group, "transaction-monitor-timeout", lambda: partition.registration_timeouts)
    registry.gauge(group, "application-failures", lambda: partition.application_failures)
    registry.gauge(group, "long-wait-flushes", lambda: partition.long_wait_flushes)
    registry.gauge(group, "is-stopped", lambda: partition.stopped is not None)
