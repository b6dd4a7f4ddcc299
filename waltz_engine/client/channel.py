"""The one thing the client needs from a connection, so the mock driver can stand in for TCP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from waltz_engine.common.errors import ProtocolError
from waltz_engine.net.channel import WRITE_BUFFER_LOW_BYTES, FramedConnection
from waltz_engine.net.transport import StreamReader
from waltz_engine.wire.client_messages import AppendRequest, ClientMessage, lone_append_frame
from waltz_engine.wire.client_stream import ClientStreamDecoder
from waltz_engine.wire.errors import TruncatedFrameError

# Bytes taken from the connection at once: a server's feed batch (64 frames of 36 bytes) and more.
RECEIVE_CHUNK_BYTES = 64 * 1024


class Channel(Protocol):
    """Messages to and from one server; ``write`` queues, ``drain`` waits while the buffer is full."""

    @property
    def closed(self) -> bool: ...

    def write(self, messages: list[ClientMessage]) -> None: ...

    @property
    def drain_may_wait(self) -> bool:
        """False when :meth:`drain` would return at once (a submit then does not await it)."""
        ...

    async def drain(self) -> None: ...

    async def receive(self) -> ClientMessage | None: ...

    async def receive_many(self) -> list[ClientMessage] | None:
        """At least one message, all that arrived together; None when the peer closed."""
        ...

    async def close(self) -> None: ...


class FramedChannel:
    """A real TLS connection speaking the 'L' codec negotiated in the Hello."""

    __slots__ = ("_conn", "_decoder", "_write_buffer_size")

    def __init__(self, conn: FramedConnection) -> None:
        self._conn = conn
        self._decoder = ClientStreamDecoder(conn.codec, conn.max_frame_size_bytes)
        # The connection's transport's (one for its life), asked once a submit without the
        # connection's property in between.
        self._write_buffer_size = conn.writer.transport.get_write_buffer_size

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def version(self) -> int:
        return self._conn.version

    def write(self, messages: list[ClientMessage]) -> None:
        conn = self._conn
        if len(messages) == 1:
            # An append, most often: its frame packed in one go (the same bytes as the codec's).
            message = messages[0]
            frame = lone_append_frame(message, conn.codec.version) if type(message) is AppendRequest else None
            conn.send_frame(frame if frame is not None else conn.codec.encode_frame(message))
            return
        encode = conn.codec.encode_frame
        # One buffer, one socket write for everything queued in this turn of the loop.
        conn.send_frame(b"".join([encode(message) for message in messages]))

    @property
    def drain_may_wait(self) -> bool:
        # ``FramedConnection.drain_may_wait``, read from its transport directly.
        return self._write_buffer_size() > WRITE_BUFFER_LOW_BYTES

    async def drain(self) -> None:
        await self._conn.drain()

    async def receive(self) -> ClientMessage | None:
        assert not self._decoder.buffered_bytes, "receive() after receive_many() would skip bytes"
        message: ClientMessage | None = await self._conn.receive()
        return message

    async def receive_many(self) -> list[ClientMessage] | None:
        decoder = self._decoder
        reader = self._conn.reader
        while True:
            data = await reader.read(RECEIVE_CHUNK_BYTES)
            if not data:
                if decoder.buffered_bytes:
                    raise TruncatedFrameError(f"stream ended {decoder.buffered_bytes} bytes into a frame")
                return None
            messages = decoder.feed(data)
            if messages:
                return messages

    @property
    def buffered_bytes(self) -> int:
        """Bytes the connection received that :meth:`receive_many` has not taken yet."""
        return self._stream_reader().buffered_bytes

    def sink(
        self,
        on_messages: Callable[[list[ClientMessage]], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        """From now on cut the frames in the transport's read callback and hand each read's whole
        messages to ``on_messages`` there (no task, no loop turn), until :meth:`unsink` or the
        end, which goes to ``on_end`` once: None for the end of the stream or an error the reader
        holds (:meth:`receive_many` reports them), else the decoder's error. Only with nothing
        buffered (:attr:`buffered_bytes`): the bytes read since are cut with the same decoder."""
        reader = self._stream_reader()
        assert not reader.buffered_bytes, "receive_many() first: those bytes came before"
        feed = self._decoder.feed

        def on_data(data: bytes) -> None:
            try:
                messages = feed(data)
            except ProtocolError as e:
                reader.unsink()
                on_end(e)
                return
            if messages:
                on_messages(messages)

        reader.sink(on_data, lambda _error: on_end(None))

    def unsink(self) -> None:
        """Bytes wait for :meth:`receive_many` again (the reader's own limit pauses reading)."""
        self._stream_reader().unsink()

    def _stream_reader(self) -> StreamReader:
        reader = self._conn.reader
        assert isinstance(reader, StreamReader), "connections are built with net.transport.StreamReader"
        return reader

    async def close(self) -> None:
        await self._conn.close()
