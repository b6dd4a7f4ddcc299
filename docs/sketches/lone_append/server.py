"""The sketch's server: one TLS connection on a blocking thread, each frame a lone APPEND to one
segment, in the variant given (``python-minimal``, ``c``, ``product-append`` or
``floor-together``). Not the product (issue 33's sketch).

python server.py VARIANT SEG_PATH IDX_PATH FIRST_TXID WARM_UP [SO_PATH] (product-append: SEG_PATH
is the storage directory, the others unused): prints its port, then, when the client closes, the
thread's CPU ns and the process's CPU ns over the requests after the first WARM_UP, and how many
they were.
"""

from __future__ import annotations

import ctypes
import os
import resource
import socket
import ssl
import struct
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

from waltz_engine.bench.floor import SYNC_RECORD_BYTES
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES
from waltz_engine.disk.record_format import CHECKPOINT_INTERVAL, INDEX_ENTRY, INDEX_ENTRY_SIZE_BYTES
from waltz_engine.disk.record_run import WIRE_PREFIX_BYTES
from waltz_engine.net.tls import TlsConfig, server_context
from waltz_engine.storage import StorageManager
from waltz_engine.wire.frame import FRAME_HEADER
from waltz_engine.wire.storage_messages import (
    APPEND_REQUEST_TYPE,
    HEADER,
    SUCCESS_FRAME,
    read_whole_append,
    success_frame,
)

LOOPBACK = "127.0.0.1"
# The largest frame the sketch reads (its client sends 512 B of data a record).
MAX_FRAME_BYTES = 64 * 1024
# An APPEND_REQUEST up to its first record's data (the product's read_whole_append reads the same).
APPEND_HEAD = struct.Struct(">b" + HEADER.struct_format + "iq20xi")
RECORDS_START = struct.calcsize(">b" + HEADER.struct_format + "i")
CHECKSUM_BYTES = 4
CRC = struct.Struct(">I")
# The C function's state: seg_fd, idx_fd, first_txid, next_txid, next_offset.
STATE_FIELDS = 5
C_NOT_TAKEN = -1
PRODUCT_KEY = uuid.UUID("3f1e2d3c-4b5a-4697-8887-96a5b4c3d2e1")
PRODUCT_PARTITION_ID = 0


def read_frame(sock: ssl.SSLSocket, view: memoryview) -> int:
    """One frame into ``view`` (one in flight: nothing after it); its length, 0 at the end."""
    have = 0
    while have < FRAME_HEADER.size or have < FRAME_HEADER.size + FRAME_HEADER.unpack_from(view, 0)[2]:
        got = sock.recv_into(view[have:])
        if not got:
            return 0
        have += got
    return have


def serve_python(
    sock: ssl.SSLSocket, seg_fd: int, idx_fd: int, first_txid: int, count_request: Counter
) -> None:
    """python-minimal: the smallest Python that parses, writes, syncs and answers."""
    buf = bytearray(MAX_FRAME_BYTES)
    view = memoryview(buf)
    unpack_head = APPEND_HEAD.unpack_from
    pack_crc, pack_entry, pack_answer = CRC.pack, INDEX_ENTRY.pack, success_frame
    crc32, pwrite, fdatasync = zlib.crc32, os.pwrite, os.fdatasync
    begin = FRAME_HEADER.size + RECORDS_START
    next_txid, offset = first_txid, HEADER_SIZE_BYTES
    while have := read_frame(sock, view):
        kind, session_id, seq_num, partition_id, count, txid, length = unpack_head(buf, FRAME_HEADER.size)
        stop = begin + WIRE_PREFIX_BYTES + length + CHECKSUM_BYTES
        if kind != APPEND_REQUEST_TYPE or count != 1 or length < 0 or stop + 1 != have or txid != next_txid:
            raise ValueError(f"not a lone append of txid {next_txid}")
        prefix = view[begin : begin + WIRE_PREFIX_BYTES]
        checksum = view[stop - CHECKSUM_BYTES : stop]
        data = view[begin + WIRE_PREFIX_BYTES : stop - CHECKSUM_BYTES]
        record = b"".join((prefix, checksum, data, pack_crc(crc32(data, crc32(checksum, crc32(prefix))))))
        pwrite(seg_fd, record, offset)
        pwrite(idx_fd, pack_entry(offset), HEADER_SIZE_BYTES + INDEX_ENTRY_SIZE_BYTES * (txid - first_txid))
        offset += len(record)
        next_txid = txid + 1
        if next_txid % CHECKPOINT_INTERVAL == 0:
            os.fsync(idx_fd)
            os.fsync(seg_fd)
        else:
            fdatasync(seg_fd)
        sock.sendall(pack_answer(session_id, seq_num, partition_id))
        count_request()


def serve_floor_together(sock: ssl.SSLSocket, seg_fd: int, count_request: Counter) -> None:
    """floor-together: the floor's two parts in one thread, request by request (read a frame,
    one ``SYNC_RECORD_BYTES`` pwrite + fdatasync, a fixed answer): no parse, CRC, index or check.
    What the floor's sum becomes when the thread sleeps in the sync between TLS reads."""
    buf = bytearray(MAX_FRAME_BYTES)
    view = memoryview(buf)
    record = bytes(SYNC_RECORD_BYTES)
    answer = bytes(SUCCESS_FRAME.size)
    pwrite, fdatasync = os.pwrite, os.fdatasync
    offset = HEADER_SIZE_BYTES
    while read_frame(sock, view):
        pwrite(seg_fd, record, offset)
        offset += SYNC_RECORD_BYTES
        fdatasync(seg_fd)
        sock.sendall(answer)
        count_request()


def serve_c(
    sock: ssl.SSLSocket, seg_fd: int, idx_fd: int, first_txid: int, count_request: Counter, so_path: str
) -> None:
    """c: the same work in one C call between the TLS read and the TLS write."""
    lone_append = ctypes.CDLL(so_path).lone_append
    lone_append.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lone_append.restype = ctypes.c_long
    buf = bytearray(MAX_FRAME_BYTES)
    view = memoryview(buf)
    payload = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + FRAME_HEADER.size
    state = (ctypes.c_int64 * STATE_FIELDS)(seg_fd, idx_fd, first_txid, first_txid, HEADER_SIZE_BYTES)
    state_at = ctypes.addressof(state)
    answer = bytearray(SUCCESS_FRAME.size)
    answer_at = ctypes.addressof(ctypes.c_char.from_buffer(answer))
    frame_header = FRAME_HEADER.size
    while have := read_frame(sock, view):
        answered = lone_append(payload, have - frame_header, state_at, answer_at)
        if answered < 0:
            raise OSError(-answered, "lone_append") if answered != C_NOT_TAKEN else ValueError("not taken")
        sock.sendall(answer)
        count_request()


def serve_product(sock: ssl.SSLSocket, directory: str, count_request: Counter) -> None:
    """product-append: the product's own objects for the same work (its data port's decoder,
    ``Partition.append_next``, ``success_frame``), without its connection thread, loop, routing,
    session checks and metrics: what those objects alone cost."""
    buf = bytearray(MAX_FRAME_BYTES)
    view = memoryview(buf)
    with StorageManager(Path(directory), PRODUCT_KEY, 1, segment_size_threshold_bytes=1 << 30) as manager:
        manager.set_partition_assignment([PRODUCT_PARTITION_ID], True)
        partition = manager.partition(PRODUCT_PARTITION_ID)
        while have := read_frame(sock, view):
            msg = read_whole_append(bytes(view[FRAME_HEADER.size : have]))
            if msg is None or partition.append_next(msg.records) is None:
                raise ValueError("not a lone append")
            sock.sendall(success_frame(msg.session_id, msg.seq_num, msg.partition_id))
            count_request()


class Counter:
    """Counts answers; reads the clocks when the warm-up ends."""

    def __init__(self, warm_up: int) -> None:
        self.warm_up = warm_up
        self.answered = 0
        self.thread_ns = 0
        self.process_ns = 0

    def __call__(self) -> None:
        self.answered += 1
        if self.answered == self.warm_up:
            self.thread_ns, self.process_ns = time.thread_time_ns(), process_cpu_ns()


def process_cpu_ns() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round((usage.ru_utime + usage.ru_stime) * 1e9)


def main(argv: list[str]) -> None:
    variant, seg_path, idx_path, first, warm_up = argv[:5]
    listener = socket.create_server((LOOPBACK, 0))
    print(listener.getsockname()[1], flush=True)
    counter = Counter(int(warm_up))
    result: list[int] = []

    def serve() -> None:
        raw, _ = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with server_context(TlsConfig()).wrap_socket(raw, server_side=True) as sock:
            if variant == "product-append":
                serve_product(sock, seg_path, counter)
            else:
                seg_fd, idx_fd = os.open(seg_path, os.O_RDWR), os.open(idx_path, os.O_RDWR)
                if variant == "floor-together":
                    serve_floor_together(sock, seg_fd, counter)
                elif variant == "c":
                    serve_c(sock, seg_fd, idx_fd, int(first), counter, argv[5])
                else:
                    serve_python(sock, seg_fd, idx_fd, int(first), counter)
                os.close(seg_fd)
                os.close(idx_fd)
            thread_ns, process_ns = time.thread_time_ns(), process_cpu_ns()
        result.extend((thread_ns - counter.thread_ns, process_ns - counter.process_ns))
        result.append(counter.answered - counter.warm_up)

    thread = threading.Thread(target=serve, name=f"lone-append-{variant}")
    thread.start()
    thread.join()
    print(*result, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
