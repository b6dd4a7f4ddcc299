"""One connection to one server, reconnecting until closed (the original's WaltzNetworkClient).

A network client is never reused after its connection drops: its owner replaces it with a
new one whose ``seq_num`` is one higher, so the server can tell stale connections apart
(reference §2.4). Only a failed connect is retried in place. Every wait before a connect
(after a drop, after a failed connect) comes from the endpoint's shared
:func:`~waltz_engine.client.backoff.reconnect_backoff`: exponential, jittered, capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol

from waltz_engine.client.channel import Channel, FramedChannel
from waltz_engine.client.errors import ClientTlsRefusedError
from waltz_engine.client.unfinished import Unfinished, raising
from waltz_engine.common.backoff import Backoff
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.channel import ConnectionClosedError
from waltz_engine.wire.client_messages import ClientMessage

log = logging.getLogger(__name__)

Endpoint = str  # "host:port", as the cluster manager publishes it (waltz_engine.common.address parses it)
OpenChannel = Callable[[Endpoint], Awaitable[Channel]]

# A certificate refusal seen on this many connects in a row fails the calls waiting on the
# endpoint at once (one alone may be a server going down mid-handshake).
REFUSALS_BEFORE_FAILING = 2


class NetworkClientOwner(Protocol):
    # Whether on_messages_now may be called from the connection's read callback (the stream
    # client's; the RPC client reads on its task).
    handles_messages_now: bool

    def on_channel_ready(self, network_client: NetworkClient) -> None: ...

    async def on_message(self, network_client: NetworkClient, message: ClientMessage) -> None: ...

    async def on_messages(self, network_client: NetworkClient, messages: list[ClientMessage]) -> None:
        """Messages that arrived together, in order (a feed batch)."""
        ...

    def on_messages_now(
        self, network_client: NetworkClient, messages: list[ClientMessage]
    ) -> Unfinished | None:
        """:meth:`on_messages` in the read callback, as far as nothing waits; the rest (None:
        nothing left) is awaited on the reader task before anything that arrived after it."""
        ...

    def on_disconnected(self, network_client: NetworkClient) -> None: ...

    def on_refused(self, network_client: NetworkClient, error: ClientTlsRefusedError) -> None: ...


class NetworkClient:
    def __init__(
        self,
        endpoint: Endpoint,
        seq_num: int,
        open_channel: OpenChannel,
        owner: NetworkClientOwner,
        backoff: Backoff,
    ) -> None:
        self.endpoint = endpoint
        self.seq_num = seq_num
        self._open_channel = open_channel
        self._owner = owner
        self._backoff = backoff
        self.connects = 0  # connect attempts made (metrics, tests)
        self.last_connect_error: BaseException | None = None  # of the last failed attempt
        self.refused: ClientTlsRefusedError | None = None  # set while connects are refused at TLS
        self._channel: Channel | None = None
        self._outbox: list[ClientMessage] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"NetworkClient({self.endpoint}, seq={self.seq_num})"

    @property
    def ready(self) -> bool:
        return self._channel is not None and not self._channel.closed and not self._closed

    def start(self, wait_first: bool = False) -> None:
        """Connect (first waiting the backoff's next delay if ``wait_first``: a reconnect)."""
        assert self._task is None, "start() once"
        self._task = asyncio.create_task(
            self._run(wait_first), name=f"waltz-client {self.endpoint} seq={self.seq_num}"
        )

    def send(self, message: ClientMessage, write_now: bool = False) -> bool:
        """Queue ``message``; all queued in one loop turn leave in one write. False if not connected.

        ``write_now``: the caller writes at once anyway (an append, whose submit drains right
        after): with nothing else queued the message is written here, and no write is scheduled
        for the end of the turn, whose empty run would cost the loop one more iteration.
        """
        channel = self._channel
        if channel is None or self._closed:
            return False
        if write_now and not self._outbox:
            # (``_write`` written out, and the channel's closed check left to its write, which
            # makes it anyway: an append's send, once a submit)
            try:
                channel.write([message])
            except ConnectionClosedError:
                return False  # closed: nothing was written
            except (WaltzError, ConnectionError) as e:
                log.info("%r: send failed: %s", self, e)  # the reader sees it and reports it
            return True
        if channel.closed:
            return False
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._write_outbox)
        self._outbox.append(message)
        return True

    @property
    def must_drain(self) -> bool:
        """Whether :meth:`drain` has anything to do: messages wait in the outbox, or the
        connection's send buffer is above its high-water mark (a submit awaits it only then)."""
        channel = self._channel
        return bool(self._outbox) or (channel is not None and channel.drain_may_wait)

    async def drain(self) -> None:
        """Wait while the connection's send buffer is above its high-water mark."""
        channel = self._channel
        if channel is not None and not channel.closed:
            self._write_outbox()
            with contextlib.suppress(WaltzError, ConnectionError):
                await channel.drain()

    def _write_outbox(self) -> None:
        messages, self._outbox = self._outbox, []
        channel = self._channel
        if messages and channel is not None and not channel.closed:
            self._write(channel, messages)

    def _write(self, channel: Channel, messages: list[ClientMessage]) -> None:
        try:
            channel.write(messages)
        except (WaltzError, ConnectionError) as e:
            # The reader sees the broken connection too and reports it to the owner.
            log.info("%r: send failed: %s", self, e)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._channel is not None:
            await self._channel.close()

    async def _run(self, wait_first: bool) -> None:
        channel = await self._connect(wait_first)
        if channel is None:
            return
        self._channel = channel
        try:
            self._owner.on_channel_ready(self)
            if self._owner.handles_messages_now and isinstance(channel, FramedChannel):
                await self._receive_now(channel)
            else:
                await self._receive(channel)
        except (WaltzError, ConnectionError, ssl.SSLError) as e:
            # An application error was reported where it happened; it only ends the connection.
            level = logging.DEBUG if getattr(e, "application_error", False) else logging.WARNING
            log.log(level, "%r: connection lost: %s", self, e)
        finally:
            await channel.close()
            if not self._closed:
                self._closed = True
                self._owner.on_disconnected(self)

    async def _receive(self, channel: Channel) -> None:
        """Each read's messages to the owner, on this task."""
        while not self._closed and await self._receive_one(channel):
            pass

    async def _receive_one(self, channel: Channel) -> bool:
        """One read's messages to the owner, on this task; False at the end of the stream."""
        messages = await channel.receive_many()
        if messages is None:
            log.info("%r: server closed the connection", self)
            return False
        await self._owner.on_messages(self, messages)
        return True

    async def _receive_now(self, channel: FramedChannel) -> None:
        """Each read's messages to the owner in the connection's read callback (issue 33: a lone
        commit's feed settles its transaction with no task woken and no loop turn); the rest of a
        batch the owner cannot finish there is awaited here, and while it is, the bytes that
        follow wait in the reader, which this task then reads as :meth:`_receive` does (its limit
        pausing the socket: back pressure as before) until nothing is buffered. The order of the
        messages is the order they arrived in, whichever path handles them."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not channel.buffered_bytes:
                # None: the end (receive_many reports it); else the rest of a batch, or an error.
                handed: asyncio.Future[Unfinished | BaseException | None] = loop.create_future()
                self._sink(channel, handed)
                try:
                    outcome = await handed
                except BaseException:
                    if handed.done() and not handed.cancelled():
                        left = handed.result()
                        if isinstance(left, Unfinished):
                            left.discard()
                    raise
                finally:
                    channel.unsink()
                if isinstance(outcome, Unfinished):
                    await outcome
                    continue
                if outcome is not None:
                    raise outcome
            if not await self._receive_one(channel):
                return

    def _sink(
        self, channel: FramedChannel, handed: asyncio.Future[Unfinished | BaseException | None]
    ) -> None:
        """Messages to the owner in the read callback until one hands ``handed`` what is left."""
        owner = self._owner

        def on_messages(messages: list[ClientMessage]) -> None:
            if self._closed or handed.done():
                return  # closing: what arrives is not handled (the task is cancelled)
            try:
                rest = owner.on_messages_now(self, messages)
            except BaseException as e:  # raised on the task, where it always was
                rest = Unfinished(raising(e))
            if rest is not None:
                channel.unsink()
                handed.set_result(rest)

        def on_end(error: BaseException | None) -> None:
            if not handed.done():
                handed.set_result(error)

        channel.sink(on_messages, on_end)

    async def _connect(self, wait_first: bool) -> Channel | None:
        if wait_first:
            await asyncio.sleep(self._backoff.next_delay_ms() / 1000)
        refusals = 0
        while not self._closed:
            self.connects += 1
            try:
                channel = await self._open_channel(self.endpoint)
                self.refused = None
                return channel
            except (WaltzError, OSError) as e:
                self.last_connect_error = e
                delay_ms = self._backoff.next_delay_ms()
                if isinstance(e, ClientTlsRefusedError):
                    refusals += 1
                    self.refused = e
                    log.log(
                        logging.WARNING if refusals == 1 else logging.DEBUG,
                        "%r: %s (retrying in %.0f ms, then less often)",
                        self,
                        e,
                        delay_ms,
                    )
                    if refusals >= REFUSALS_BEFORE_FAILING:
                        self._owner.on_refused(self, e)
                else:
                    refusals = 0
                    log.info("%r: cannot connect (retrying in %.0f ms): %s", self, delay_ms, e)
            await asyncio.sleep(delay_ms / 1000)
        return None
