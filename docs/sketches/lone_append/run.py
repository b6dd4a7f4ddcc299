"""Runs issue 33's lone-append sketch: checks each variant's files against the product's, then
measures the CPU floor and each variant's server CPU per request, alternating, ``--rounds`` times.

python docs/sketches/lone_append/run.py --rounds 3 [--requests 5000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

from waltz_engine.bench import floor
from waltz_engine.common.record import Record
from waltz_engine.common.reqid import ReqId
from waltz_engine.disk.record_run import read_wire_record_run
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.storage import StorageManager
from waltz_engine.storage.segment_files import create_segment_files
from waltz_engine.wire.primitives import write_records
from waltz_engine.wire.storage_messages import (
    STORAGE_CODEC,
    SUCCESS_FRAME,
    StorageAppendRequest,
    success_frame,
)

HERE = Path(__file__).resolve().parent
# The sketch's two, checked against the product's bytes; then the product's own objects for the
# same work, and the floor's two parts done in one thread, measured alongside (neither checked:
# the first writes the product's files by construction, the second no record).
VARIANTS = ("python-minimal", "c")
FLOOR_TOGETHER = "floor-together"  # (its answer is fixed bytes)
MEASURED = (*VARIANTS, "product-append", FLOOR_TOGETHER)
KEY = uuid.UUID("3f1e2d3c-4b5a-4697-8887-96a5b4c3d2e1")
PARTITION_ID = 0
FIRST_TXID = 0
DATA_BYTES = 512
SESSION_ID = 7
# Requests each server answers before its clocks start (the handshake, warm caches).
WARM_UP_REQUESTS = 200
# The check's requests: past the first checkpoint (txid 1000), where both files are fsynced.
CHECK_REQUESTS = 1_200
# Segments never roll over in the check (one segment each side).
LARGE_THRESHOLD_BYTES = 1 << 30
# Both files' header bytes that hold the creation time (each file takes its own clock).
CREATION_TIME_BYTES = slice(4, 12)
FIXED_CLOCK_MS = 1_700_000_000_000
# perf's sampling rate.
PERF_HZ = 2_000
# The smallest share perf's report lists.
PERF_PERCENT_LIMIT = 0.5


def records(count: int) -> list[Record]:
    out = []
    for i in range(count):
        data = (i.to_bytes(8, "big") * (DATA_BYTES // 8))[:DATA_BYTES]
        checksum = zlib.crc32(data)
        out.append(Record(FIRST_TXID + i, ReqId(1, 2, 3, i), i % 5, data, checksum - (checksum >> 31 << 32)))
    return out


def frames(recs: list[Record]) -> list[bytes]:
    """APPEND_REQUEST frames by the product's encoder, one record each."""
    return [
        STORAGE_CODEC.encode_frame(StorageAppendRequest(SESSION_ID, seq, PARTITION_ID, (rec,), False))
        for seq, rec in enumerate(recs)
    ]


def compile_c(scratch: Path) -> Path:
    so_path = scratch / "lone_append.so"
    command = ["gcc", "-O2", "-shared", "-fPIC", "-o", str(so_path), str(HERE / "lone_append.c"), "-lz"]
    subprocess.run(command, check=True)
    return so_path


def run_server(
    variant: str, directory: Path, so_path: Path, all_frames: list[bytes], perf_data: Path | None = None
) -> dict[str, float]:
    """One variant's server on a fresh segment in ``directory``, sent ``all_frames`` one in flight;
    with ``perf_data``, ``perf record`` of the server process after the warm-up into that file."""
    directory.mkdir()
    seg_path, idx_path = directory / "segment.seg", directory / "segment.idx"
    if variant == "product-append":
        seg_path = directory  # (the product's StorageManager makes its files there)
    else:
        create_segment_files(KEY, PARTITION_ID, seg_path, idx_path, FIRST_TXID, lambda: FIXED_CLOCK_MS)
    command = [sys.executable, str(HERE / "server.py"), variant, str(seg_path), str(idx_path)]
    command += [str(FIRST_TXID), str(min(WARM_UP_REQUESTS, len(all_frames))), str(so_path)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        perf = None
        raw = socket.create_connection((floor.LOOPBACK, port))
        with client_context(TlsConfig()).wrap_socket(raw, server_hostname=floor.LOOPBACK) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for seq, frame in enumerate(all_frames):
                sock.sendall(frame)
                answer = floor._receive_exactly(sock, SUCCESS_FRAME.size)
                if answer != success_frame(SESSION_ID, seq, PARTITION_ID) and variant != FLOOR_TOGETHER:
                    raise RuntimeError(f"{variant}: answer {seq} is {answer!r}")
                if perf_data is not None and seq + 1 == WARM_UP_REQUESTS:
                    # (perf attaches while the requests go on: it samples only the measured ones.)
                    perf_command = ["perf", "record", "-q", "-F", str(PERF_HZ), "-p", str(server.pid)]
                    perf = subprocess.Popen([*perf_command, "-o", str(perf_data)], stdin=subprocess.DEVNULL)
            if perf is not None:
                # Stopped before the connection closes: the server's exit (its interpreter's
                # teardown, gc included) is not a request's.
                perf.send_signal(signal.SIGINT)
                perf.wait()
        thread_ns, process_ns, measured = (int(x) for x in server.stdout.readline().split())
        server.wait()
    finally:
        if server.poll() is None:
            server.kill()
    per = max(measured, 1)
    return {"thread_us": thread_ns / per / 1e3, "process_us": process_ns / per / 1e3, "requests": measured}


def masked(data: bytes) -> bytes:
    out = bytearray(data)
    out[CREATION_TIME_BYTES] = bytes(CREATION_TIME_BYTES.stop - CREATION_TIME_BYTES.start)
    return bytes(out)


def product_files(directory: Path, recs: list[Record]) -> tuple[bytes, bytes]:
    """What the product's lone append (``Partition.append_next``) writes for ``recs``."""
    directory.mkdir()
    with StorageManager(directory, KEY, 1, segment_size_threshold_bytes=LARGE_THRESHOLD_BYTES) as manager:
        manager.set_partition_assignment([PARTITION_ID], True)
        partition = manager.partition(PARTITION_ID)
        for rec in recs:
            out = bytearray()
            write_records(out, [rec])
            run, _ = read_wire_record_run(bytes(out), 0)
            if partition.append_next(run) is None:
                raise RuntimeError(f"the product did not take txid {rec.transaction_id} alone")
    (seg,) = directory.rglob("*.seg")
    (idx,) = directory.rglob("*.idx")
    return seg.read_bytes(), idx.read_bytes()


def check(scratch: Path, so_path: Path) -> None:
    recs = records(CHECK_REQUESTS)
    seg, idx = product_files(scratch / "check-product", recs)
    for variant in VARIANTS:
        run_server(variant, scratch / f"check-{variant}", so_path, frames(recs))
        for name, product in (("segment.seg", seg), ("segment.idx", idx)):
            written = (scratch / f"check-{variant}" / name).read_bytes()
            if masked(written) != masked(product):
                raise RuntimeError(f"{variant}: {name} differs from the product's")
        print(f"check: {variant} wrote the product's bytes ({len(seg)} + {len(idx)} B, {len(recs)} records)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5_000, help="measured requests a variant a round")
    parser.add_argument("--perf", action="store_true", help="then each variant once under perf, by library")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory's parent (its disk)")
    args = parser.parse_args()
    all_frames = frames(records(WARM_UP_REQUESTS + args.requests))
    rows = []
    with tempfile.TemporaryDirectory(prefix="lone-append-", dir=args.dir) as name:
        scratch = Path(name)
        so_path = compile_c(scratch)
        check(scratch, so_path)
        for round_number in range(1, args.rounds + 1):
            started = time.strftime("%H:%M:%S", time.gmtime())
            load = os.getloadavg()[0]
            cpu_floor_us = floor.measure(scratch).request_cpu_floor_ms * 1e3
            # (Each round the other way round: a drifting load favours neither.)
            order = MEASURED if round_number % 2 else MEASURED[::-1]
            row: dict[str, object] = {"round": round_number, "start_utc": started, "load": round(load, 2)}
            row["floor_us"] = round(cpu_floor_us, 1)
            for variant in order:
                got = run_server(variant, scratch / f"r{round_number}-{variant}", so_path, all_frames)
                row[variant] = {key: round(value, 1) for key, value in got.items()}
                row[f"{variant}_ratio"] = round(got["thread_us"] / cpu_floor_us, 2)
            row["load_after"] = round(os.getloadavg()[0], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.perf:
            for variant in MEASURED:
                perf_data = scratch / f"perf-{variant}.data"
                got = run_server(variant, scratch / f"perf-{variant}", so_path, all_frames, perf_data)
                print(f"perf of {variant}: {got['thread_us']:.1f} us a request (thread, under perf)")
                for sort in ("dso", "dso,sym"):
                    report = ["perf", "report", "-i", str(perf_data), "--sort", sort, "--stdio", "-q"]
                    report += ["--percent-limit", str(PERF_PERCENT_LIMIT)]
                    print(
                        subprocess.run(report, capture_output=True, text=True, check=True).stdout, flush=True
                    )


if __name__ == "__main__":
    main()
