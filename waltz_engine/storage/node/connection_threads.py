"""A thread per data connection: a server's appends read, made durable and answered on one thread.

On the loop, a lone append request costs a selector turn, the hop to a disk pass's thread and
the pass's machinery: about a third of a storage node's CPU per request (docs/benchmarks.md).
Once a data connection's OPEN succeeded, a thread of its own may read it instead
(:class:`ConnectionThread`): it waits for the socket with ``poll``, reads it under the
transport's lock (the socket stays non-blocking: the loop and the passes' threads still write
to it, :meth:`SocketTransport.write_from_thread`), cuts and decodes the frames with the same
codec, and routes each request as the loop's read callback would:

- a lone request (the read brought no other: MAX_INLINE_REQUESTS) of a partition with nothing
  queued or on disk: the thread runs it itself (:meth:`DiskPasses.run_claimed`: the same
  checks, the same append and ``fdatasync``, the answer written from this thread) - no loop
  turn, no hop to the pool. A read that is one whole APPEND of one record (a lone appender's
  every request) is all done in one call (:meth:`ConnectionThread._lone_append`: read from
  the frame's bytes, checked, appended, synced and answered), without the general path's
  objects and calls, which take anything unusual;
- otherwise the requests queue behind what waits for the partition and the node's passes take
  them: a partition's order across connections, and group commit across connections and
  partitions, are the passes' as before. A pass these requests start (none was running) runs
  on this thread (:meth:`DiskPasses.ready_off_loop` ``here``), as a lone request does: no hop
  to the pool's pass thread. What arrives meanwhile would wait for the next pass anyway; it
  waits in the socket instead, and this thread reads it once the pass is answered (16 active
  partitions: a pass every 20-30 ms carrying 7-8 partitions, docs/benchmarks.md);
- a request that waits for a session check or for room in a full queue, an OPEN and anything
  not a partition's request go to the loop's path (:meth:`PartitionWorker.submit`, the
  handler's ``later``); the thread waits for it, so the connection's order holds.

What stays as it was:

- "no state until the first byte": a thread only after the handshake and a successful OPEN,
  at most ``max_threads`` per node (MAX_CONNECTION_THREADS); beyond them, the loop's path;
- PASS_WAIT_MS: a thread on disk for longer than that (a hung disk) is left behind by the
  node's watch, which runs on the loop while threads exist, every WATCH_INTERVAL_MS and when a
  thread it saw on disk would be PASS_WAIT_MS late: the loop reads the connection from the
  bytes the thread left unread, so the connection's requests of other partitions wait about
  PASS_WAIT_MS at most (and a timer's lateness; twice that behind a pass of several
  partitions the thread runs, whose own gather hands its late ones off at PASS_WAIT_MS); the
  connection stays on the loop from then on;
- the simulator: its transports are not sockets, so it never starts a thread and runs the
  loop's path as before;
- the end: a peer's close (with close-notify or without, as Netty's), a bad frame or a failed
  read ends the connection on the loop, which closes it; a node that stops closes the
  connections, and each thread sees it at its next read or within READ_POLL_MS, and is joined
  (STOP_THREADS_TIMEOUT_S at most; a thread left on a hung disk is abandoned, a daemon).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import select
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from waltz_engine.common import clock
from waltz_engine.common.errors import ProtocolError
from waltz_engine.disk.record_run import disk_record
from waltz_engine.net.channel import (
    WRITE_BUFFER_HIGH_BYTES,
    ConnectionClosedError,
    FramedConnection,
    HandBack,
)
from waltz_engine.net.socket_transport import (
    READ_CLOSED,
    READ_WAIT_READABLE,
    READ_WAIT_WRITABLE,
    SocketTransport,
)
from waltz_engine.storage.node.disk_passes import PASS_WAIT_MS, DiskPasses
from waltz_engine.storage.node.held_batch import online_partition
from waltz_engine.storage.node.partition_worker import PARTITION_REQUEST_TYPES, PartitionWorker, Pending
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES, FrameDecoder
from waltz_engine.wire.primitives import INT32_SIZE_BYTES
from waltz_engine.wire.storage_messages import (
    APPEND_FRAME_HEAD,
    APPEND_FRAME_RECORDS_START,
    APPEND_REQUEST_TYPE,
    STORAGE_DATA_PORT_CODEC,
    StorageAppendRunRequest,
    read_whole_append,
    success_frame,
)

log = logging.getLogger(__name__)

# Data connections read by a thread of their own, per node; the others are read by the loop.
MAX_CONNECTION_THREADS = 16
# One read takes at most this much (a TLS record is 16 KiB; a frame is cut across reads).
THREAD_READ_BUFFER_BYTES = 64 * 1024
# Bytes read before the requests they hold are served, at most (the loop's read callback's
# MAX_READ_PER_CALLBACK_BYTES): those that arrived together go to disk together.
MAX_READ_PER_ROUTE_BYTES = 1024 * 1024
# A read's requests (all of one partition) that the thread runs itself, at most. More that
# arrived together mean more in flight behind them: those go to the passes, so that reading
# the next ones goes on beside this batch's fsync (as on the loop), rather than after it.
MAX_INLINE_REQUESTS = 1
# A thread waiting for bytes looks this often whether its connection was closed under it
# (the descriptor may then be another's) or the node stops.
READ_POLL_MS = 100
# While the peer does not read its answers (the write buffer above its high-water mark), the
# thread reads nothing more; it looks again this often (the loop drains the buffer).
BACK_PRESSURE_WAIT_MS = 5
# How often the loop looks for a thread on disk, at least: one seen on disk is looked at again
# when it would be PASS_WAIT_MS late (so it is left behind then, not up to an interval after).
# Each look wakes the loop and takes the GIL from the threads: a few a second, not 40.
WATCH_INTERVAL_MS = PASS_WAIT_MS
# A look is not asked for sooner than this after the one before (a timer may fire a little early).
MIN_WATCH_DELAY_MS = 1
# How long a stopping node waits for its connection threads.
STOP_THREADS_TIMEOUT_S = 10.0

_ENDED = HandBack(True, None, (), b"")
_unpack_append_head = APPEND_FRAME_HEAD.unpack_from
_monotonic_s = time.monotonic
_APPEND_HEAD_BYTES = APPEND_FRAME_HEAD.size
_RECORD_AT = APPEND_FRAME_RECORDS_START


class _Stopping(Exception):
    """The node stops: the thread ends without waiting for the loop."""


class ConnectionThread:
    """Reads one data connection in the loop's place until it ends or is handed back."""

    def __init__(
        self,
        owner: ConnectionThreads,
        conn: FramedConnection,
        transport: SocketTransport,
        worker_of: Callable[[int], PartitionWorker | None],
        refusal: Callable[[Any, PartitionWorker | None], bytes | None],
        later: Callable[[Any], Awaitable[None]],
        authorizes: bool,
    ) -> None:
        """``authorizes``: ``refusal`` checks the ACLs (else it refuses only a partition without a
        worker here), which :meth:`_lone_append` leaves to the general path."""
        self._owner = owner
        self._loop = owner.loop
        self._passes = owner.passes
        self._conn = conn
        self._transport = transport
        self._worker_of = worker_of
        self._refusal = refusal
        self._later = later
        codec = conn.codec
        # (Its APPENDs are read with read_whole_append, as this codec reads them.)
        assert codec is STORAGE_DATA_PORT_CODEC, codec.label
        self._decode = codec.decode_frame
        self._decode_payload = codec.decode
        self._decoder = FrameDecoder(
            codec.magic, codec.version, max_frame_size_bytes=conn.max_frame_size_bytes
        )
        # What :meth:`_lone_append` needs, looked up once: the frame header it accepts, and the
        # answer's write (straight to the socket: a data connection never coalesces its writes).
        assert not conn.coalescing
        self._lone = not authorizes
        self._magic, self._version = codec.magic, codec.version
        self._max_frame_size_bytes = conn.max_frame_size_bytes
        self._write_from_thread = transport.write_from_thread
        # Resolved on the loop with how the thread ended (or what the watch handed back).
        self.done: asyncio.Future[HandBack] = self._loop.create_future()
        # Guards the two fields below, between this thread and the loop's watch.
        self._state = threading.Lock()
        # When the batch this thread runs itself started (None: it runs none).
        self._on_disk_since_s: float | None = None
        # The watch gave the connection back to the loop: this thread reads no more.
        self._left_behind = False
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"storage-data-{conn.peer}", daemon=True)

    # --- on the loop -------------------------------------------------------------------------

    def leave_behind_if_late(self, now_s: float) -> tuple[bool, float | None]:
        """On the loop (the watch): a batch on disk for PASS_WAIT_MS hands the connection back
        (True). And when the batch on disk now would be that late (None: none is)."""
        with self._state:
            since = self._on_disk_since_s
            if since is None or self._left_behind:
                return False, None
            if now_s - since < PASS_WAIT_MS / 1000:
                return False, since + PASS_WAIT_MS / 1000
            self._left_behind = True
            # The thread is on disk: it touches neither the decoder nor the socket until it
            # has seen this flag.
            unread = self._decoder.take_unread()
        self._resolve(HandBack(False, None, (), unread))
        return True, None

    def _resolve(self, outcome: HandBack) -> None:
        if not self.done.done():
            self.done.set_result(outcome)

    # --- on the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            outcome = self._serve()
        except _Stopping:
            outcome = _ENDED
        except ProtocolError as e:
            self._loop_call(self._transport.abort)
            outcome = HandBack(True, e, (), b"")
        except (OSError, ConnectionClosedError) as e:  # (ssl.SSLError is an OSError)
            outcome = HandBack(True, e, (), b"")
        except Exception as e:
            log.exception("data connection from %s: its thread failed", self._conn.peer)
            outcome = HandBack(True, e, (), b"")
        finally:
            self._owner.ended(self)
        if outcome is not None:
            self._loop_call(self._resolve, outcome)

    def _loop_call(self, callback: Callable[..., object], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody waits any more)
            self._loop.call_soon_threadsafe(callback, *args)

    def _serve(self) -> HandBack | None:
        """Read until the end; None: left behind (the loop reads from here). What the socket
        holds is read before it is served (MAX_READ_PER_ROUTE_BYTES at most), as the loop's read
        callback does, so that requests that arrived together go to disk together."""
        transport = self._transport
        fd = transport.fileno()
        poller = select.poll()
        polled_for = 0  # the event ``fd`` is registered for (registered once, changed rarely)
        buffer = memoryview(bytearray(THREAD_READ_BUFFER_BYTES))
        decoder, decode = self._decoder, self._decode
        whole_payload, decode_payload = decoder.whole_payload, self._decode_payload
        messages: list[Any] = []
        read_bytes = 0
        wait_for = 0  # 0: read at once if bytes wait; else the poll event to wait for first
        while True:
            if self.stopping:
                raise _Stopping
            if wait_for == 0 and not transport.unread_for_thread():
                wait_for = select.POLLIN
            if messages and (wait_for or read_bytes >= MAX_READ_PER_ROUTE_BYTES):
                # Nothing more waits (or enough was read): serve what was read, then wait.
                if not self._route(messages):
                    return None
                messages = []
                read_bytes = 0
                continue
            if self._conn.closed:
                return _ENDED
            if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH_BYTES:
                time.sleep(BACK_PRESSURE_WAIT_MS / 1000)  # the peer does not read its answers
                continue
            if wait_for:
                if wait_for != polled_for:
                    poller.register(fd, wait_for)  # (registered already: changes the event)
                    polled_for = wait_for
                ready = poller.poll(READ_POLL_MS)
                if not ready:
                    continue
                wait_for = 0
            size = transport.read_from_thread(buffer)
            if size > 0 and not messages and (served := self._lone_append(buffer, size)) is not None:
                if not served:
                    return None
                wait_for = select.POLLIN  # (nothing more was there to read: the poll tells)
                continue
            if size == READ_WAIT_READABLE:
                wait_for = select.POLLIN
                continue
            if size == READ_WAIT_WRITABLE:
                wait_for = select.POLLOUT
                continue
            if size == READ_CLOSED:
                return _ENDED
            if size == 0:
                # The peer closed (with close-notify or without): what it sent before is served
                # first, as on the loop.
                if messages and not self._route(messages):
                    return None
                if decoder.buffered_bytes:
                    # The loop's decoder names the truncated frame when the end reaches it.
                    return HandBack(False, None, (), decoder.take_unread())
                return _ENDED
            read_bytes += size
            data = buffer[:size]
            payload = whole_payload(data)
            if payload is not None:
                # One whole frame (a lone request's read): no Frame, no list of them; an APPEND
                # read in one pass (read_whole_append), anything else by the codec.
                msg = read_whole_append(payload)
                messages.append(decode_payload(payload) if msg is None else msg)
            else:
                # Several frames (16 active partitions: 7-8 requests a read), each APPEND read
                # as above; keep-alives (None) and the rest by the codec.
                for frame in decoder.feed(data):
                    msg = read_whole_append(frame.payload)
                    if msg is None:
                        msg = decode(frame)
                    if msg is not None:
                        messages.append(msg)

    def _route(self, messages: list[Any]) -> bool:
        """Serve what was read, in order; False: left behind meanwhile."""
        conn = self._conn
        if len(messages) == 1:
            # A lone request (one in flight): no grouping by partition.
            msg = messages[0]
            if type(msg) in PARTITION_REQUEST_TYPES:
                worker = self._worker_of(msg.partition_id)
                refused = self._refusal(msg, worker)
                if refused is not None:
                    conn.send_frames_from_thread((refused,), self._loop)
                    return True
                assert worker is not None
                if not worker.needs_check(msg):
                    return self._run_or_queue(worker, [(conn, msg)])
        held: dict[PartitionWorker, list[Pending]] = {}
        for msg in messages:
            if type(msg) not in PARTITION_REQUEST_TYPES:
                self._queue(held)
                held = {}
                self._on_loop(self._later(msg))
                continue
            worker = self._worker_of(msg.partition_id)
            refused = self._refusal(msg, worker)
            if refused is not None:
                conn.send_frames_from_thread((refused,), self._loop)
                continue
            assert worker is not None
            if worker.needs_check(msg):
                self._queue(held)
                held = {}
                self._on_loop(worker.submit(conn, msg))
                continue
            held.setdefault(worker, []).append((conn, msg))
        if len(held) == 1:
            ((worker, batch),) = held.items()
            if len(batch) <= MAX_INLINE_REQUESTS:
                return self._run_or_queue(worker, batch)
        return self._queue(held, here=True)

    def _run_or_queue(self, worker: PartitionWorker, batch: list[Pending]) -> bool:
        """One partition's requests: run here when nothing of it is queued or on disk."""
        if not self._claim(worker, len(batch)):
            return self._queue({worker: batch}, here=True)
        return self._on_disk(0.0, self._passes.run_claimed, worker, batch)

    def _lone_append(self, buffer: memoryview, size: int) -> bool | None:
        """A read of ``size`` bytes that is one whole APPEND of one record, all else read, for a
        partition with nothing queued or on disk (a lone appender's every request), done in
        this one call: the work of :meth:`_route`, :meth:`_run_or_queue`,
        :meth:`DiskPasses.run_claimed` and :meth:`PartitionWorker.append_alone` for it (the same
        checks in the same order, the same bytes written and synced, the same answer and
        metrics), read from the frame's bytes with one unpack, with no message, run, batch or
        outcome built. None: nothing done, the general path takes the read (a frame in parts or
        several, more bytes to read (in OpenSSL or the kernel: requests that arrived together go
        to disk together), a partition busy or not here, a session check due, the ACLs); else
        as :meth:`_route`. A request claimed that is not the session's next record on an online
        replica with room in its segment goes to the general path's batch of one
        (:meth:`DiskPasses.run_claimed`), which answers it."""
        if size <= _APPEND_HEAD_BYTES or not self._lone:
            return None
        (magic, version, length, kind, session_id, seq_num, partition_id, count, txid, data_bytes) = (
            _unpack_append_head(buffer)
        )
        stop = _APPEND_HEAD_BYTES + data_bytes + INT32_SIZE_BYTES  # the record's end; its flag byte
        if (
            kind != APPEND_REQUEST_TYPE
            or count != 1
            or data_bytes < 0
            or stop + 1 != size
            or length != size - FRAME_HEADER_SIZE_BYTES
            or magic != self._magic
            or version != self._version
            or length > self._max_frame_size_bytes
            or self._decoder.buffered_bytes
            or self._transport.unread_for_thread()
        ):
            return None
        worker = self._worker_of(partition_id)
        if worker is None or worker.waits_for_check(session_id) or not self._claim(worker, 1):
            return None
        return self._on_disk(0.0, self._lone_work, worker, buffer, size, session_id, seq_num, txid, stop)

    def _lone_work(
        self,
        worker: PartitionWorker,
        buffer: memoryview,
        size: int,
        session_id: int,
        seq_num: int,
        txid: int,
        stop: int,
    ) -> None:
        """:meth:`_lone_append`'s claimed request, on disk and answered (under :meth:`_on_disk`)."""
        partition_id = worker.partition_id
        frame: bytes | None = None
        try:
            partition = online_partition(worker, session_id, buffer[stop] != 0)
            if partition is not None:
                started_s = _monotonic_s()
                try:
                    span = partition.append_record(txid, disk_record(buffer, _RECORD_AT, stop))
                except Exception as e:  # (cut back: as ``append_alone``)
                    frame = worker._append_failed(partition, _message(buffer, size), e)
                else:
                    if span is not None:
                        worker.first_transaction_id, worker.max_transaction_id = span
                        worker.appended(started_s)
                        frame = success_frame(session_id, seq_num, partition_id)
        except Exception:
            log.exception("partition %d: a batch failed", partition_id)  # (as disk_passes' _process)
            frame = b""  # unanswered
        if frame is None:
            self._passes.run_claimed(worker, [(self._conn, _message(buffer, size))])
        else:
            if frame and self._write_from_thread(frame):
                self._conn.writes += 1
            self._passes.claimed_done(worker)

    def _claim(self, worker: PartitionWorker, count: int) -> bool:
        """``count`` requests of ``worker`` are this thread's to run: nothing of its partition is
        queued or on disk, and the passes count the batch; False: they queue instead."""
        passes = self._passes
        with passes.lock:
            if not worker.claim_off_loop(count):
                return False
            if passes.claim():
                return True
            worker.unclaim()
            return False

    def _on_disk(self, grace_s: float, work: Callable[..., None], *args: Any) -> bool:
        """Run ``work(*args)`` on this thread, watched (PASS_WAIT_MS after ``grace_s``); False:
        left behind meanwhile."""
        with self._state:
            self._on_disk_since_s = clock.monotonic_s() + grace_s
        try:
            work(*args)
        finally:
            with self._state:
                self._on_disk_since_s = None
                left_behind = self._left_behind
        return not left_behind

    def _queue(self, held: dict[PartitionWorker, list[Pending]], here: bool = False) -> bool:
        """Behind what waits for each partition, for the passes; a full queue is waited for on
        the loop (this thread reads nothing meanwhile: back pressure). ``here``: a pass this
        starts runs on this thread; False: left behind meanwhile."""
        if not held:
            return True
        pass_here: Callable[[], None] | None = None
        passes = self._passes
        ready: list[PartitionWorker] = []
        full: list[tuple[PartitionWorker, list[Pending]]] = []
        with passes.lock:
            for worker, batch in held.items():
                count, is_ready = worker.queue_off_loop(batch)
                if is_ready and count:
                    ready.append(worker)
                if count < len(batch):
                    full.append((worker, batch[count:]))
            if ready:
                # Not with a queue full: its rest waits on the loop for room that a pass makes.
                pass_here = passes.ready_off_loop(ready, here=here and not full)
        for worker, rest in full:
            self._on_loop(worker.queue_in_order(rest))
        # A pass of several partitions hands its own late ones off at PASS_WAIT_MS and returns
        # (DiskPasses' gather): watched from then on, or the watch and the gather both took the
        # same stall for late, racing, and the connection went back to the loop for nothing.
        return True if pass_here is None else self._on_disk(PASS_WAIT_MS / 1000, pass_here)

    def _on_loop(self, work: Awaitable[None]) -> None:
        """Run ``work`` on the loop and wait for it (errors are raised here)."""
        future = asyncio.run_coroutine_threadsafe(_awaited(work), self._loop)
        while True:
            try:
                future.result(timeout=READ_POLL_MS / 1000)
                return
            except concurrent.futures.CancelledError:
                raise _Stopping from None  # (the loop is ending its tasks)
            except concurrent.futures.TimeoutError:
                if self.stopping:
                    future.cancel()
                    raise _Stopping from None


async def _awaited(work: Awaitable[None]) -> None:
    await work


def _message(buffer: memoryview, size: int) -> StorageAppendRunRequest:
    """The APPEND that :meth:`ConnectionThread._lone_append` read, as the codec reads it (for the
    general path)."""
    msg = read_whole_append(bytes(buffer[FRAME_HEADER_SIZE_BYTES:size]))
    assert msg is not None
    return msg


class ConnectionThreads:
    """The node's connection threads: started on the loop, watched, joined when it stops."""

    def __init__(self, loop: asyncio.AbstractEventLoop, passes: DiskPasses, max_threads: int) -> None:
        assert max_threads >= 0
        self.loop = loop
        self.passes = passes
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._threads: set[ConnectionThread] = set()
        self._watch: asyncio.TimerHandle | None = None
        self._stopping = False

    def count(self) -> int:
        with self._lock:
            return len(self._threads)

    def start(
        self,
        conn: FramedConnection,
        worker_of: Callable[[int], PartitionWorker | None],
        refusal: Callable[[Any, PartitionWorker | None], bytes | None],
        later: Callable[[Any], Awaitable[None]],
        authorizes: bool = False,
    ) -> ConnectionThread | None:
        """On the loop, reading paused: a thread reads ``conn`` from now on (None: the loop goes
        on, as for a transport that is not a socket's, the simulator's)."""
        transport = conn.writer.transport
        if not isinstance(transport, SocketTransport) or conn.closed:
            return None
        with self._lock:
            if self._stopping or len(self._threads) >= self._max_threads:
                return None
            thread = ConnectionThread(self, conn, transport, worker_of, refusal, later, authorizes)
            self._threads.add(thread)
        thread.thread.start()
        if self._watch is None:
            self._watch = self.loop.call_later(WATCH_INTERVAL_MS / 1000, self._look)
        return thread

    def ended(self, thread: ConnectionThread) -> None:
        with self._lock:
            self._threads.discard(thread)

    def _look(self) -> None:
        """On the loop while threads exist: every WATCH_INTERVAL_MS, and when a thread seen on
        disk would be PASS_WAIT_MS late."""
        self._watch = None
        with self._lock:
            threads = list(self._threads)
        now_s = clock.monotonic_s()
        next_s = now_s + WATCH_INTERVAL_MS / 1000
        for thread in threads:
            left_behind, late_s = thread.leave_behind_if_late(now_s)
            if left_behind:
                self.passes.count_late()
            elif late_s is not None:
                next_s = min(next_s, late_s)
        if threads and not self._stopping:
            delay_s = max(next_s - now_s, MIN_WATCH_DELAY_MS / 1000)
            self._watch = self.loop.call_later(delay_s, self._look)

    async def stop(self) -> None:
        """Start no more; the threads end (their connections are closed by now) and are joined,
        STOP_THREADS_TIMEOUT_S at most (one still on a hung disk is abandoned)."""
        with self._lock:
            self._stopping = True
            threads = list(self._threads)
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for thread in threads:
            thread.stopping = True

        def join() -> None:
            deadline_s = clock.monotonic_s() + STOP_THREADS_TIMEOUT_S
            for thread in threads:
                thread.thread.join(max(0.0, deadline_s - clock.monotonic_s()))
            left = [t.thread.name for t in threads if t.thread.is_alive()]
            if left:
                log.warning("stopping: %d data connection threads did not end: %s", len(left), left)

        await self.loop.run_in_executor(None, join)
