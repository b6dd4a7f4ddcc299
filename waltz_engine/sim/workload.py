"""What a seed's client does and what it must see: the transactions and the application.

A transaction of the workload is a :class:`SimContext` numbered ``0 .. n-1``; its number is the
record's header, so the log tells which one a record is, and its data is a payload of its own
(:func:`payload`: distinct bytes of a drawn size, now and then up to the frame limit). The
application (:class:`Application`) is durable state, as a database would be: a client that
restarts gets the same one and resumes from the high-water mark it stored. It reads every
transaction's data before applying it (``await transaction.data()``, through the server's cache)
and reports bytes other than the client built. :func:`check_outcomes` holds every context's final
outcome against the log the application applied.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

from waltz_engine.client import Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_engine.client.errors import (
    AuthorizationError,
    ClientClosedError,
    DataChecksumError,
    OutcomeUnknownError,
)
from waltz_engine.common.errors import WaltzError
from waltz_engine.common.reqid import ReqId

# Payload sizes: most small, some of a few KiB, now and then up to the largest append the
# server's frame limit admits (the world sets that limit: MAX_PAYLOAD_BYTES).
SMALL_PAYLOAD_BYTES = (8, 256)
MEDIUM_PAYLOAD_BYTES = (256, 16 * 1024)
MEDIUM_PAYLOAD_PROBABILITY = 0.08
LARGE_PAYLOAD_PROBABILITY = 0.015
AT_LIMIT_PAYLOAD_PROBABILITY = 0.005
# The world's server admits frames up to this size; an append's message around its data (ids,
# locks, header, lengths, checksum) is below APPEND_OVERHEAD_BYTES.
SERVER_FRAME_LIMIT_BYTES = 1024 * 1024
APPEND_OVERHEAD_BYTES = 256
MAX_PAYLOAD_BYTES = SERVER_FRAME_LIMIT_BYTES - APPEND_OVERHEAD_BYTES
# An application retries a data read that failed (the server unreachable for a while) this
# often, for at most this long, before it reports the read failed.
DATA_RETRY_S = 1.0
DATA_READ_LIMIT_S = 300.0


def payload_size_bytes(rng: random.Random) -> int:
    draw = rng.random()
    if draw < AT_LIMIT_PAYLOAD_PROBABILITY:
        return MAX_PAYLOAD_BYTES
    if draw < AT_LIMIT_PAYLOAD_PROBABILITY + LARGE_PAYLOAD_PROBABILITY:
        return rng.randint(MEDIUM_PAYLOAD_BYTES[1], MAX_PAYLOAD_BYTES)
    if draw < AT_LIMIT_PAYLOAD_PROBABILITY + LARGE_PAYLOAD_PROBABILITY + MEDIUM_PAYLOAD_PROBABILITY:
        return rng.randint(*MEDIUM_PAYLOAD_BYTES)
    return rng.randint(*SMALL_PAYLOAD_BYTES)


def payload(number: int, size_bytes: int) -> bytes:
    """Transaction ``number``'s data: its number, then bytes no other transaction has."""
    head = number.to_bytes(8, "big")
    seed = hashlib.blake2b(head, digest_size=8).digest()
    body = random.Random(seed).randbytes(max(0, size_bytes - len(head)))
    return (head + body)[:size_bytes]


class ApplicationError(Exception):
    """The workload's own failure: a transaction that refuses to be executed again."""


class _RawBytes:
    def serialize(self, value: bytes) -> bytes:
        return value

    def deserialize(self, data: bytes) -> bytes:
        return data


RAW = _RawBytes()


class SimContext(TransactionContext):
    """One transaction of the workload; its outcome is a future on the loop. One that
    ``refuses_retry`` raises :class:`ApplicationError` when the client executes it again.
    ``incarnation`` is the client it was last submitted to (a restart closes the one before)."""

    def __init__(
        self,
        number: int,
        outcome: asyncio.Future[bool],
        refuses_retry: bool = False,
        data: bytes | None = None,
    ) -> None:
        super().__init__()
        self.number = number
        self.data = number.to_bytes(8, "big") if data is None else data
        self.outcome = outcome
        self.executions = 0
        self.refuses_retry = refuses_retry
        self.declined = False  # its last execute returned False: nothing to append
        self.incarnation = 0

    def partition_id(self, num_partitions: int) -> int:
        return self.number % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        self.executions += 1
        if self.refuses_retry and self.executions > 1:
            raise ApplicationError(f"transaction {self.number} refuses to run again")
        self.declined = not self.fill(builder)
        if not self.declined:
            builder.set_header(self.number)
        return not self.declined

    def fill(self, builder: TransactionBuilder) -> bool:
        """The transaction's data and locks; False to decline."""
        builder.set_transaction_data(self.data, RAW)
        return True

    def on_completion(self, result: bool) -> None:
        if not self.outcome.done():
            self.outcome.set_result(result)

    def on_exception(self, exception: BaseException) -> None:
        if not self.outcome.done():
            self.outcome.set_exception(exception)

    @property
    def refused(self) -> bool:
        """It ended in its own application error: it must not be in the log."""
        done = self.outcome.done() and not self.outcome.cancelled()
        return done and isinstance(self.outcome.exception(), ApplicationError)


class Application(WaltzClientCallbacks):
    """The application: remembers every transaction it applied, in order, and checks that its
    high-water mark only ever moves to the next transaction. ``on_apply`` is the workload's own
    state change (the bank's balances)."""

    def __init__(
        self,
        on_apply: Callable[[Transaction], None] | None = None,
        payloads: dict[int, bytes] | None = None,
    ) -> None:
        self.applied: dict[int, list[tuple[int, int, ReqId]]] = {}  # partition -> (txid, header, reqId)
        self.changed = asyncio.Event()
        self.uncaught: list[str] = []
        self.violations: list[str] = []
        # Partitions whose feed the servers' ACLs refused this client (WorldShape.acl).
        self.read_refused: set[int] = set()
        self._on_apply = on_apply
        # Each transaction's data as the client built it (by number); None: data not read.
        self.payloads = payloads
        self.data_reads = 0

    def get_client_high_water_mark(self, partition_id: int) -> int:
        applied = self.applied.get(partition_id)
        return applied[-1][0] if applied else -1

    async def apply_transaction(self, transaction: Transaction) -> None:
        if self.payloads is not None:
            await self._read_data(transaction)
        self._apply(transaction)

    async def _read_data(self, transaction: Transaction) -> None:
        """The data, as an application reads it before applying: it must be the bytes built."""
        assert self.payloads is not None
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + DATA_READ_LIMIT_S
        where = f"partition {transaction.partition_id} txid {transaction.transaction_id}"
        while True:
            try:
                data = await transaction.data()
                break
            except ClientClosedError:
                raise  # the application's process is ending (a restart): applied by the next one
            except DataChecksumError as e:
                self.violations.append(f"{where}: damaged data served again and again: {e}")
                raise
            except WaltzError as e:
                if loop.time() + DATA_RETRY_S > deadline_s:
                    self.violations.append(f"{where}: its data could not be read: {e}")
                    raise
                await asyncio.sleep(DATA_RETRY_S)
        self.data_reads += 1
        built = self.payloads.get(transaction.header)
        if built is None or data != built:
            size = "?" if built is None else len(built)
            self.violations.append(
                f"{where} (transaction {transaction.header}): the data read is {len(data)} bytes other "
                f"than the {size} bytes the client appended"
            )

    def _apply(self, transaction: Transaction) -> None:
        partition_id = transaction.partition_id
        high_water_mark = self.get_client_high_water_mark(partition_id)
        if transaction.transaction_id != high_water_mark + 1:
            self.violations.append(
                f"partition {partition_id}: the client high-water mark {high_water_mark} moved to "
                f"{transaction.transaction_id}"
            )
        self.applied.setdefault(partition_id, []).append(
            (transaction.transaction_id, transaction.header, transaction.req_id)
        )
        if self._on_apply is not None:
            self._on_apply(transaction)
        self.changed.set()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        if isinstance(exception, AuthorizationError):
            self.read_refused.add(partition_id)
            return
        if isinstance(exception, ClientClosedError):
            return  # a data read cut short by the client's close (a restart): nothing was applied
        self.uncaught.append(f"partition {partition_id} txid {transaction_id}: {exception!r}")

    def count(self) -> int:
        return sum(len(applied) for applied in self.applied.values())

    def headers_seen(self) -> dict[int, int]:
        """How many times each header (a transaction's number) is in the applied log."""
        seen: dict[int, int] = {}
        for applied in self.applied.values():
            for _, header, _ in applied:
                seen[header] = seen.get(header, 0) + 1
        return seen


def check_outcomes(application: Application, contexts: list[SimContext], incarnation: int) -> list[str]:
    """Each context's outcome against the log: committed ones in it once, the others never
    (an unknown one at most once); txids dense from 0. A context may end not committed only when
    it declined, or unknown or not committed only when the client it went to was closed."""
    violations = [f"the application failed: {failure}" for failure in application.uncaught]
    violations += application.violations
    for partition_id, applied in sorted(application.applied.items()):
        txids = [txid for txid, _, _ in applied]
        if txids != list(range(len(txids))):
            violations.append(f"partition {partition_id}: txids not dense from 0: {txids[:10]}...")
    seen = application.headers_seen()
    for context in contexts:
        count = seen.get(context.number, 0)
        in_log = f"(in the log {count} times)"
        closed = context.incarnation < incarnation
        outcome = context.outcome
        if context.refused:
            if count != 0:
                violations.append(f"transaction {context.number} refused to run again yet is {in_log}")
        elif not outcome.done() or outcome.cancelled():  # (the run's time limit)
            violations.append(f"transaction {context.number} ended without an outcome {in_log}")
        elif outcome.exception() is not None:
            error = outcome.exception()
            # A closed client's attempt may have committed (unknown) or was never sent (closed).
            unknown = isinstance(error, OutcomeUnknownError) and count <= 1
            if isinstance(error, AuthorizationError):
                if count != 0:  # refused by the ACLs: certainly not committed
                    violations.append(f"transaction {context.number} was refused by the ACLs yet is {in_log}")
            elif not (closed and (unknown or (isinstance(error, ClientClosedError) and count == 0))):
                violations.append(f"transaction {context.number} was reported failed: {error!r} {in_log}")
        elif not outcome.result():
            if count != 0 or not (context.declined or closed):
                violations.append(f"transaction {context.number} was reported not committed {in_log}")
        elif count != 1:
            violations.append(f"transaction {context.number} is in the log {count} times")
    return violations
