"""One smoke-test client process (the original's smoke-test client thread, reference §5.2).

Run as ``python -m waltz_engine.smoke.workload --config client.yml --out DIR ...``. It submits
transactions (random UUID data, partition = hash % partitions, one write lock
``("test", rand(1000))``) and applies every partition's transactions, recording:

* ``DIR/committed.log``: ``<uuid hex> <latency ms>`` per context that completed (committed);
* ``DIR/not_committed.log``, ``DIR/unknown.log``: ``<uuid hex>`` per context told
  ``on_completion(False)``, and per one that ended with ``OutcomeUnknownError``;
* ``DIR/applied.log``: ``<partition> <transaction id> <uuid hex>`` per applied transaction;
* stdout: one JSON progress line per second (``state``, counts, applied high-water marks).

The runner steers it through stdin: ``stop`` ends submitting (then it flushes and reports
state ``flushed``), ``exit`` closes the client and ends the process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from waltz_engine.client import (
    OutcomeUnknownError,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError

COMMITTED_FILE = "committed.log"
NOT_COMMITTED_FILE = "not_committed.log"
UNKNOWN_FILE = "unknown.log"
APPLIED_FILE = "applied.log"
LOCK_NAME = "test"
NUM_LOCKS = 1000
# The original sleeps 1 ms between submits; the client's per-partition limit of outstanding
# transactions is what really paces it.
SUBMIT_INTERVAL_S = 0.001
PROGRESS_INTERVAL_S = 1.0
FLUSH_RETRY_S = 0.5
PARTITION_HASH_MASK = 0x7FFFFFFF  # Java's hashCode() & 0x7FFFFFFF
PARTITION_HASH_BYTES = 4
NO_TRANSACTION = -1
MS_PER_S = 1000.0
STOP = "stop"
EXIT = "exit"

STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
FLUSHED = "flushed"
DONE = "done"


def partition_of(data: uuid.UUID, num_partitions: int) -> int:
    return (int.from_bytes(data.bytes[:PARTITION_HASH_BYTES], "big") & PARTITION_HASH_MASK) % num_partitions


class Workload(WaltzClientCallbacks):
    """The counters, the record files, and the application side (callbacks) of one client."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.committed_file: IO[str] = (out / COMMITTED_FILE).open("w", encoding="ascii")
        self.applied_file: IO[str] = (out / APPLIED_FILE).open("w", encoding="ascii")
        self.not_committed_file: IO[str] = (out / NOT_COMMITTED_FILE).open("w", encoding="ascii")
        self.unknown_file: IO[str] = (out / UNKNOWN_FILE).open("w", encoding="ascii")
        self.record_files = (
            self.committed_file,
            self.applied_file,
            self.not_committed_file,
            self.unknown_file,
        )
        self.marks: dict[int, int] = {}
        self.state = STARTING
        self.submitted = 0
        self.committed = 0
        self.applied = 0
        self.retries = 0
        self.lock_failures = 0
        self.failed = 0
        self.not_committed = 0
        self.unknown = 0
        self.apply_errors = 0
        self.last_error = ""

    # --- callbacks (application side) ---------------------------------------------------------

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.marks.get(partition_id, NO_TRANSACTION)

    async def apply_transaction(self, transaction: Transaction) -> None:
        data = await transaction.data()  # raising here makes the client feed it again
        self.applied_file.write(f"{transaction.partition_id} {transaction.transaction_id} {data.hex()}\n")
        self.marks[transaction.partition_id] = transaction.transaction_id
        self.applied += 1

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.apply_errors += 1
        self.last_error = f"apply {partition_id}/{transaction_id}: {exception}"

    # --- contexts (producer side) -------------------------------------------------------------

    def on_committed(self, data: uuid.UUID, latency_ms: float) -> None:
        self.committed_file.write(f"{data.hex} {latency_ms:.3f}\n")
        self.committed += 1

    def on_not_committed(self, data: uuid.UUID) -> None:
        self.not_committed_file.write(f"{data.hex}\n")
        self.not_committed += 1

    def on_failed(self, data: uuid.UUID, exception: BaseException) -> None:
        self.failed += 1
        self.last_error = f"context: {exception!r}"
        if isinstance(exception, OutcomeUnknownError):
            self.unknown_file.write(f"{data.hex}\n")
            self.unknown += 1

    def progress(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "submitted": self.submitted,
            "committed": self.committed,
            "applied": self.applied,
            "retries": self.retries,
            "lock_failures": self.lock_failures,
            "failed": self.failed,
            "not_committed": self.not_committed,
            "unknown": self.unknown,
            "apply_errors": self.apply_errors,
            "marks": {str(p): m for p, m in sorted(self.marks.items())},
            "last_error": self.last_error,
        }

    def report(self) -> None:
        for file in self.record_files:
            file.flush()
        sys.stdout.write(json.dumps(self.progress()) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        for file in self.record_files:
            file.close()


class SmokeContext(TransactionContext):
    def __init__(self, workload: Workload, data: uuid.UUID, lock_id: int) -> None:
        super().__init__()
        self.workload = workload
        self.data = data
        self.lock = PartitionLocalLock(LOCK_NAME, lock_id)
        self.attempts = 0
        self.submitted_at = time.monotonic()

    def partition_id(self, num_partitions: int) -> int:
        return partition_of(self.data, num_partitions)

    def execute(self, builder: TransactionBuilder) -> bool:
        self.attempts += 1
        if self.attempts > 1:
            self.workload.retries += 1
        builder.set_transaction_data(self.data.bytes)
        builder.set_write_locks([self.lock])
        return True

    def on_completion(self, result: bool) -> None:
        if result:
            self.workload.on_committed(self.data, (time.monotonic() - self.submitted_at) * MS_PER_S)
        else:
            self.workload.on_not_committed(self.data)

    def on_exception(self, exception: BaseException) -> None:
        self.workload.on_failed(self.data, exception)

    def on_lock_failure(self) -> None:
        self.workload.lock_failures += 1


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, exit_: asyncio.Event) -> None:
    """The runner's commands, read on a thread (stdin is a pipe; EOF means the runner is gone)."""
    for line in sys.stdin:
        command = line.strip()
        if command == STOP:
            loop.call_soon_threadsafe(stop.set)
        elif command == EXIT:
            break
    loop.call_soon_threadsafe(stop.set)
    loop.call_soon_threadsafe(exit_.set)


async def _report_every_second(workload: Workload) -> None:
    while True:
        workload.report()
        await asyncio.sleep(PROGRESS_INTERVAL_S)


async def _submit(
    client: WaltzClient, workload: Workload, rng: random.Random, limit: int, stop: asyncio.Event
) -> None:
    while not stop.is_set() and (limit <= 0 or workload.submitted < limit):
        context = SmokeContext(
            workload, uuid.UUID(int=rng.getrandbits(128), version=4), rng.randrange(NUM_LOCKS)
        )
        workload.submitted += 1
        with contextlib.suppress(WaltzError):  # reported through on_exception
            await client.submit(context)
        await asyncio.sleep(SUBMIT_INTERVAL_S)


async def _flush(client: WaltzClient, exit_: asyncio.Event) -> None:
    """Until every transaction sent is decided (a server may be coming back: retry)."""
    while client.has_pending_transactions() and not exit_.is_set():
        try:
            await client.flush()
        except WaltzError:
            await asyncio.sleep(FLUSH_RETRY_S)


async def run(config: WaltzClientConfig, out: Path, seed: int, limit: int) -> None:
    workload = Workload(out)
    loop = asyncio.get_running_loop()
    stop, exit_ = asyncio.Event(), asyncio.Event()
    threading.Thread(target=_watch_stdin, args=(loop, stop, exit_), daemon=True).start()
    reporter = asyncio.create_task(_report_every_second(workload))
    try:
        async with WaltzClient(workload, config) as client:
            workload.state = RUNNING
            await _submit(client, workload, random.Random(seed), limit, stop)
            workload.state = STOPPING
            await _flush(client, exit_)
            workload.state = FLUSHED
            await exit_.wait()
        workload.state = DONE
    finally:
        reporter.cancel()
        workload.report()
        workload.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="client YAML")
    parser.add_argument("--out", type=Path, required=True, help="directory for the record files")
    parser.add_argument("--seed", type=int, required=True, help="seed of the data and lock choices")
    parser.add_argument("--transactions", type=int, default=0, help="submit at most this many (0: no limit)")
    parser.add_argument("--overrides", default="{}", help="JSON: server endpoint -> proxy address")
    args = parser.parse_args(argv)
    config = WaltzClientConfig.from_config(
        Config.load(args.config), endpoint_overrides=json.loads(args.overrides)
    )
    asyncio.run(run(config, args.out, args.seed, args.transactions))


if __name__ == "__main__":
    main()
