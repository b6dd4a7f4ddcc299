"""Mount, feed, append and flush over the stream connections (the original's ``InternalStreamClient``).

Messages of one connection are handled in order on that connection's reader, so a partition's
feed is applied strictly in transaction id order; a MountResponse or FeedSuspended answering
anything but the partition's current mount (its *session*) is obsolete and ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

from waltz_engine.client.backoff import RECONNECT_BACKOFF_MAX_MS
from waltz_engine.client.base_client import BaseClient
from waltz_engine.client.config import DEFAULT_LONG_WAIT_THRESHOLD_MS, MAX_APPLICATION_ATTEMPTS
from waltz_engine.client.errors import (
    AuthorizationError,
    ClientAheadError,
    ClientClosedError,
    ClientTimeoutError,
    ClientTlsRefusedError,
    PartitionNotFoundError,
    PartitionStoppedError,
    WaltzClientError,
)
from waltz_engine.client.network_client import NetworkClient, OpenChannel
from waltz_engine.client.partition import ApplicationError, Deliver, Partition
from waltz_engine.client.transaction_monitor import TransactionFuture
from waltz_engine.client.unfinished import Unfinished
from waltz_engine.wire.client_messages import (
    AUTHORIZING_CLIENT_CODEC,
    PARTITION_STATE_CLIENT_AHEAD,
    PARTITION_STATE_NOT_READY,
    PARTITION_STATE_READY,
    AppendRequest,
    AuthorizationFailure,
    ClientMessage,
    FeedData,
    FeedRequest,
    FeedSuspended,
    FlushResponse,
    LockFailure,
    MountRequest,
    MountResponse,
)

if TYPE_CHECKING:
    from waltz_engine.client.transaction_context import TransactionContext

log = logging.getLogger(__name__)

ReportApplicationError = Callable[[int, int, BaseException], None]
# (partition id, client high-water mark, the feed's last txid): the data of what comes next may be
# asked for ahead of apply_transaction (RpcClient.feed_seen).
FeedSeen = Callable[[int, int, int], None]


_REQUEST_NAMES = {spec.type_code: spec.name for spec in AUTHORIZING_CLIENT_CODEC.specs}


def _run_end(messages: list[ClientMessage], index: int) -> int:
    """The end of the run of FeedData of one partition that starts at ``index``."""
    partition_id = messages[index].req_id.partition_id
    end, count = index + 1, len(messages)
    while end < count:
        following = messages[end]
        if type(following) is not FeedData or following.req_id.partition_id != partition_id:
            break
        end += 1
    return end


class TransactionApplicationError(WaltzClientError):
    """``apply_transaction`` raised: the stream connection is dropped; the feed resumes from the HWM."""

    application_error = True  # reported through uncaught_exception already: log it quietly


class StreamClient(BaseClient):
    def __init__(
        self,
        client_id: int,
        num_partitions: int,
        max_concurrent_transactions: int,
        open_channel: OpenChannel,
        reconnect_delay_ms: int,
        not_ready_retry_ms: int,
        deliver: Deliver,
        server_high_water_mark: Callable[[int], Awaitable[int]],
        report_application_error: ReportApplicationError | None = None,
        reconnect_max_delay_ms: int = RECONNECT_BACKOFF_MAX_MS,
        max_application_attempts: int = MAX_APPLICATION_ATTEMPTS,
        feed_seen: FeedSeen | None = None,
        remounting: Callable[[int], None] | None = None,
        long_wait_ceiling_ms: int = DEFAULT_LONG_WAIT_THRESHOLD_MS,
    ) -> None:
        super().__init__(open_channel, reconnect_delay_ms, reconnect_max_delay_ms)
        self._feed_seen = feed_seen
        self._remounting = remounting
        self._report_application_error = report_application_error
        self._max_application_attempts = max_application_attempts
        self.client_id = client_id
        self.num_partitions = num_partitions
        self._not_ready_retry_ms = not_ready_retry_ms
        self._deliver = deliver
        self._server_high_water_mark = server_high_water_mark
        self.partitions = {
            p: Partition(p, client_id, max_concurrent_transactions, long_wait_ceiling_ms)
            for p in range(num_partitions)
        }

    def partition(self, partition_id: int) -> Partition:
        partition = self.partitions.get(partition_id)
        if partition is None:
            raise PartitionNotFoundError(
                f"partition {partition_id} does not exist: "
                f"the cluster has partitions 0..{self.num_partitions - 1}"
            )
        return partition

    # -- mounting --------------------------------------------------------------------------

    def _on_assigned(self, partition_id: int, network_client: NetworkClient | None) -> None:
        partition = self.partitions[partition_id]
        partition.generation = max(partition.generation, self.generation(partition_id))
        partition.mounting(network_client)

    def _on_mountable(self, network_client: NetworkClient, partition_id: int) -> None:
        partition = self.partitions[partition_id]
        if not partition.is_active or partition.network_client is not network_client:
            return  # inactive partitions are mounted when set_partitions activates them
        if partition.refused_read is not None:
            return  # the server's ACLs refuse this client the partition
        partition.mounting(network_client)
        if self._remounting is not None:
            self._remounting(partition_id)
        req_id = partition.next_req_id()
        partition.session = req_id
        log.info("sending MountRequest: %r to %r", partition, network_client)
        network_client.send(MountRequest(req_id, partition.client_high_water_mark, network_client.seq_num))

    def mount(self, partition: Partition) -> None:
        network_client = partition.network_client
        if network_client is not None and network_client.ready:
            self._on_mountable(network_client, partition.partition_id)

    async def check_ahead(self, partition: Partition) -> None:
        """After CLIENT_AHEAD: remount if the server has caught up, else say why we cannot go on."""
        try:
            server_hwm = await self._server_high_water_mark(partition.partition_id)
        except WaltzClientError as e:
            raise ClientAheadError(
                f"partition {partition.partition_id}: the client's stored high-water mark "
                f"{partition.client_high_water_mark} is ahead of the server's (server's unknown: {e})"
            ) from None
        if partition.client_high_water_mark <= server_hwm:
            partition.client_ahead = False  # the server caught up: mount again (now or when connected)
            self.mount(partition)
            return
        raise ClientAheadError(
            f"partition {partition.partition_id}: the client's stored high-water mark "
            f"{partition.client_high_water_mark} is ahead of the server's {server_hwm}; the application's "
            "state is newer than this Waltz cluster's log "
            "(wrong cluster root, or a log that lost transactions)"
        )

    # -- messages --------------------------------------------------------------------------

    # The connection's read callback may hand batches to on_messages_now (NetworkClient).
    handles_messages_now = True

    async def on_messages(self, network_client: NetworkClient, messages: list[ClientMessage]) -> None:
        """A feed batch: each run of FeedData of one partition is applied in one go.

        Before any is applied, every partition's data is asked for ahead as far as this batch goes
        (within the prefetch budget), so the requests are in flight while the first ones apply.
        """
        self._feed_seen_batch(messages)
        await self._handle(network_client, messages, 0)

    def on_messages_now(
        self, network_client: NetworkClient, messages: list[ClientMessage]
    ) -> Unfinished | None:
        """:meth:`on_messages` in the connection's read callback, as far as nothing waits: None when
        the whole batch was handled, else the rest (from the first callback that returned something
        to await, or a partition whose feed is still applied elsewhere) for the reader task, which
        awaits it before anything that arrived after. Raises as :meth:`on_messages` does."""
        index, count = 0, len(messages)
        feed_seen = self._feed_seen
        if feed_seen is None:
            pass
        elif count == 1 and type(lone := messages[0]) is FeedData:
            # One appender's commit, one frame in a read: ``_feed_seen_batch`` written out.
            partition = self.partitions.get(lone.req_id.partition_id)
            if partition is not None:
                feed_seen(partition.partition_id, partition.client_high_water_mark, lone.transaction_id)
        else:
            self._feed_seen_batch(messages)
        while index < count:
            message = messages[index]
            if type(message) is not FeedData:
                self._on_control(network_client, message)
                index += 1
                continue
            # A lone FeedData (one appender's commit) is its own run: no call to find its end.
            end = index + 1 if index + 1 == count else _run_end(messages, index)
            partition = self.partitions.get(message.req_id.partition_id)
            if partition is None:
                log.warning("message for unknown partition from %r: %s", network_client, message)
            else:
                run: list[FeedData] = messages[index:end]  # type: ignore[assignment]  # (no cast call)
                try:
                    rest = partition.apply_now(run, self._deliver)
                except ApplicationError as failed:
                    raise self._apply_failed(partition, failed) from failed.__cause__
                if rest is not None:
                    return Unfinished(
                        self._finish_batch(network_client, partition, rest, messages, end), rest.discard
                    )
            index = end
        return None

    async def _finish_batch(
        self,
        network_client: NetworkClient,
        partition: Partition,
        rest: Unfinished,
        messages: list[ClientMessage],
        index: int,
    ) -> None:
        try:
            await rest
        except ApplicationError as failed:
            raise self._apply_failed(partition, failed) from failed.__cause__
        await self._handle(network_client, messages, index)

    def _feed_seen_batch(self, messages: list[ClientMessage]) -> None:
        feed_seen = self._feed_seen
        if feed_seen is not None:
            last: dict[int, int] = {}
            for message in messages:
                if type(message) is FeedData:
                    last[message.req_id.partition_id] = message.transaction_id
            for partition_id, transaction_id in last.items():
                partition = self.partitions.get(partition_id)
                if partition is not None:
                    feed_seen(partition_id, partition.client_high_water_mark, transaction_id)

    async def _handle(self, network_client: NetworkClient, messages: list[ClientMessage], index: int) -> None:
        count = len(messages)
        while index < count:
            message = messages[index]
            if type(message) is not FeedData:
                await self.on_message(network_client, message)
                index += 1
                continue
            partition_id = message.req_id.partition_id
            end = _run_end(messages, index)
            partition = self.partitions.get(partition_id)
            if partition is None:
                log.warning("message for unknown partition from %r: %s", network_client, message)
            else:
                await self._apply(partition, cast("list[FeedData]", messages[index:end]))
            index = end

    async def on_message(self, network_client: NetworkClient, message: ClientMessage) -> None:
        if isinstance(message, FeedData):
            partition = self.partitions.get(message.req_id.partition_id)
            if partition is None:
                log.warning("message for unknown partition from %r: %s", network_client, message)
                return
            await self._apply(partition, [message])
        else:
            self._on_control(network_client, message)

    def _on_control(self, network_client: NetworkClient, message: ClientMessage) -> None:
        """Every message but FeedData: none waits."""
        partition = self.partitions.get(message.req_id.partition_id)
        if partition is None:
            log.warning("message for unknown partition from %r: %s", network_client, message)
            return
        if isinstance(message, MountResponse):
            self._mount_response(partition, network_client, message)
        elif isinstance(message, FeedSuspended):
            if message.req_id == partition.session and partition.network_client is network_client:
                network_client.send(FeedRequest(message.req_id, partition.client_high_water_mark))
        elif isinstance(message, FlushResponse):
            partition.flush_completed(message.req_id, message.transaction_id)
        elif isinstance(message, LockFailure):
            partition.lock_failed(message)
        elif isinstance(message, AuthorizationFailure):
            self._authorization_failure(partition, message)
        else:
            log.warning("unexpected message on a stream connection from %r: %s", network_client, message)

    def _authorization_failure(self, partition: Partition, message: AuthorizationFailure) -> None:
        """Our v5: the server's ACLs refused a request. An append is certainly not committed; a
        mount or feed ends the partition's reading (see ``Partition.read_refused``), and the
        application hears it through ``uncaught_exception``."""
        request = _REQUEST_NAMES.get(message.request_type, f"request type {message.request_type}")
        error = AuthorizationError(message.operation or "?", message.partition_id, message.principal, request)
        log.info("%s", error)
        if request == "APPEND_REQUEST":
            partition.monitor.refuse(message.req_id, error)
        elif request in ("MOUNT_REQUEST", "FEED_REQUEST"):
            partition.read_refused(error)
            report = self._report_application_error
            if report is not None:
                try:
                    report(partition.partition_id, partition.client_high_water_mark, error)
                except Exception:
                    log.exception("callback error [uncaught_exception]")
        # A refused FLUSH (a read): the refused mount or feed ended the partition's appends.

    def _mount_response(
        self, partition: Partition, network_client: NetworkClient, message: MountResponse
    ) -> None:
        if message.req_id != partition.session or partition.network_client is not network_client:
            log.debug("ignoring obsolete MountResponse %s", message)
            return
        if message.partition_state == PARTITION_STATE_READY:
            self.connection_proved(network_client)
            partition.mounted_by(network_client)
            network_client.send(FeedRequest(partition.session, partition.client_high_water_mark))
        elif message.partition_state == PARTITION_STATE_NOT_READY:
            session = partition.session

            def retry() -> None:
                if partition.session == session and partition.network_client is network_client:
                    self._on_mountable(network_client, partition.partition_id)

            asyncio.get_running_loop().call_later(self._not_ready_retry_ms / 1000, retry)
        elif message.partition_state == PARTITION_STATE_CLIENT_AHEAD:
            log.error(
                "partition %d: client high-water mark %d is ahead of the server's",
                partition.partition_id,
                partition.client_high_water_mark,
            )
            partition.partition_ahead()
        else:
            log.error("MountResponse with an unknown partition state %d", message.partition_state)

    async def _apply(self, partition: Partition, feed: list[FeedData]) -> None:
        try:
            await partition.apply_transactions(feed, self._deliver)
        except ApplicationError as failed:
            raise self._apply_failed(partition, failed) from failed.__cause__

    def _apply_failed(self, partition: Partition, failed: ApplicationError) -> TransactionApplicationError:
        """``apply_transaction`` raised: reported, and the error that drops the connection."""
        error = failed.__cause__
        assert isinstance(error, Exception), failed
        self._application_failed(partition, failed.transaction_id, error)
        return TransactionApplicationError(
            f"apply_transaction failed on transaction {failed.transaction_id} "
            f"of partition {partition.partition_id}: {error}"
        )

    def _application_failed(self, partition: Partition, transaction_id: int, error: Exception) -> None:
        """Report the failure; after ``max_application_attempts`` in a row, stop the partition.

        Either way the caller drops the connection: the server forgets the mount and, after the
        backoff, the others are mounted again (a stopped partition no more).
        """
        attempts = partition.application_failures
        reported: BaseException = error
        if attempts >= self._max_application_attempts:
            stopped = PartitionStoppedError(partition.partition_id, transaction_id, attempts, error)
            log.error("%s", stopped)  # the one line; each try went to uncaught_exception
            partition.stop(stopped)
            reported = stopped
        else:
            log.debug(
                "partition %d: apply_transaction raised on transaction %d (try %d of %d): %s",
                partition.partition_id,
                transaction_id,
                attempts,
                self._max_application_attempts,
                error,
            )
        report = self._report_application_error
        if report is not None:
            try:
                report(partition.partition_id, transaction_id, reported)
            except Exception:
                log.exception("callback error [uncaught_exception]")

    def on_refused(self, network_client: NetworkClient, error: ClientTlsRefusedError) -> None:
        for partition in self.partitions.values():
            if partition.network_client is network_client:
                partition.refused()

    # -- appends ---------------------------------------------------------------------------

    async def append(
        self,
        request: AppendRequest,
        context: TransactionContext | None,
        registration_timeout_ms: int,
        flush_timeout_ms: int,
    ) -> TransactionFuture:
        """Register and send, in turn; while the monitor stays full, flush and wait on (bounded)."""
        partition = self.partition(request.req_id.partition_id)
        future = partition.append_now(request, context)
        if future is not None:
            return future

        async def flush() -> None:
            pending = partition.flush_async()
            if pending is not None and not await pending.wait_flushed(flush_timeout_ms):
                raise ClientTimeoutError(
                    f"partition {partition.partition_id}: {partition.monitor.max_capacity} appends "
                    f"pending for "
                    f"{registration_timeout_ms} ms and a flush was not answered within {flush_timeout_ms} ms"
                )

        future = await partition.append(request, context, registration_timeout_ms, flush)
        assert future is not None, "with on_full, append waits until it registers or raises"
        return future

    @property
    def has_pending_transactions(self) -> bool:
        return any(p.has_pending_transactions for p in self.partitions.values())

    async def close(self) -> None:
        for partition in self.partitions.values():
            partition.close()
        await super().close()

    def require_open(self) -> None:
        if self._closed:
            raise ClientClosedError()
