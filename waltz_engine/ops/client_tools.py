"""Client tools as a library: ``tail``, ``append`` and the original's ``ClientCli`` (reference §4.4:
validate, high-water-mark, create-producer, create-consumer). The CLI is a thin skin over it.

How ``append`` learns the id of its transaction: the context remembers the ReqId of its latest
attempt (``builder.req_id``); the client calls ``on_completion(True)`` then
``apply_transaction`` for exactly the transaction whose ReqId committed, then
``on_application``. So the callbacks map that ReqId to the context, record the fed
``transaction_id`` on it, and ``on_application`` resolves the context's future with it.

Validation model (§4.4): each producer transaction carries the client high-water mark + 1 as an
8-byte big-endian long under the write lock ``("validate-lock", 0)``; a transaction the server
accepts was built against the partition's real high-water mark, so its data equals its id. The
consumer checks strictly consecutive ids and ``data == transaction id``.
"""

from __future__ import annotations

import asyncio
import math
import random
import struct
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from waltz_engine.client import (
    AuthorizationError,
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
from waltz_engine.common.reqid import ReqId
from waltz_engine.ops.tool_config import load_tool_config
from waltz_engine.zk.connection import (
    KEY_CLUSTER_ROOT,
    KEY_CONNECT_STRING,
    KEY_CONNECT_TIMEOUT,
    NO_CONFIG_SOURCE,
    refuse_unreachable,
)
from waltz_engine.zk.partition_ranges import not_in_cluster

NO_TRANSACTION = -1
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_CONSUMER_IDLE_TIMEOUT_MS = 60_000  # ours: the original consumer waits forever
# A result may take a few client timeouts (mount, flush, then a retry) before it is decided.
RESULT_TIMEOUT_FACTOR = 3
VALIDATE_LOCK = PartitionLocalLock("validate-lock", 0)
VALIDATE_DATA = struct.Struct(">q")  # Java's DataOutputStream.writeLong
MS_PER_S = 1000


class ClientToolError(WaltzError):
    """A client tool could not do its job; one line for a person."""


class ValidationError(ClientToolError):
    """``client validate`` (or a producer/consumer) found a broken guarantee."""


# --- configuration -------------------------------------------------------------------------------


def load_client_config(
    path: Path | None,
    *,
    zookeeper: str | None = None,
    cluster_root: str | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    auto_mount: bool = False,
) -> WaltzClientConfig:
    """The client YAML at ``path`` (else the local dev cluster's) with ``zookeeper`` and
    ``cluster_root`` overriding its keys; every wait bounded by ``timeout_ms``."""
    if timeout_ms <= 0:
        raise ClientToolError(f"timeout must be positive, got {timeout_ms} ms")
    loaded = load_tool_config(path)
    values = loaded.as_dict() if loaded is not None else {}
    overrides = {KEY_CONNECT_STRING: zookeeper, KEY_CLUSTER_ROOT: cluster_root}
    values.update({key: value for key, value in overrides.items() if value is not None})
    config = WaltzClientConfig.from_config(Config(values, loaded.source if loaded else NO_CONFIG_SOURCE))
    zookeeper_settings = config.zookeeper
    if zookeeper_settings is not None and KEY_CONNECT_TIMEOUT not in values:
        zookeeper_settings = zookeeper_settings._replace(connect_timeout_ms=timeout_ms)
    return replace(
        config,
        zookeeper=zookeeper_settings,
        auto_mount=auto_mount,
        ensure_mounted_timeout_ms=timeout_ms,
        registration_timeout_ms=timeout_ms,
        rpc_timeout_ms=timeout_ms,
        flush_timeout_ms=timeout_ms,
    )


async def _started(callbacks: WaltzClientCallbacks, config: WaltzClientConfig) -> WaltzClient:
    """A started client; a ZooKeeper that refuses connections fails at once, not after the timeout."""
    if config.zookeeper is not None:
        await asyncio.to_thread(refuse_unreachable, config.zookeeper)
    return await WaltzClient.create(callbacks, config)


def _check_partition(client: WaltzClient, partition_id: int) -> None:
    if not 0 <= partition_id < client.num_partitions:
        raise ClientToolError(not_in_cluster([partition_id], client.num_partitions))


# --- callbacks -----------------------------------------------------------------------------------


class HighWaterMarks(WaltzClientCallbacks):
    """Callbacks that keep the client high-water marks in memory and hand every applied
    transaction to :meth:`on_transaction` (overridden by the tools)."""

    def __init__(self, start: dict[int, int] | None = None) -> None:
        self.marks: dict[int, int] = dict(start or {})
        self.errors: list[str] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.marks.get(partition_id, NO_TRANSACTION)

    async def apply_transaction(self, transaction: Transaction) -> None:
        await self.on_transaction(transaction)
        self.marks[transaction.partition_id] = transaction.transaction_id

    async def on_transaction(self, transaction: Transaction) -> None:
        return None

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append(f"partition {partition_id}, transaction {transaction_id}: {exception}")


async def _client_from(
    callbacks: HighWaterMarks, config: WaltzClientConfig, partitions: Sequence[int], from_latest: bool
) -> WaltzClient:
    """A started client mounted on ``partitions``; ``from_latest`` starts at the servers' marks."""
    client = await _started(callbacks, config)
    try:
        for partition_id in partitions:
            _check_partition(client, partition_id)
            if from_latest:
                callbacks.marks[partition_id] = await client.high_water_mark(partition_id)
        await client.set_partitions(partitions)
    except BaseException:
        await client.close()
        raise
    return client


# --- high-water-mark -----------------------------------------------------------------------------


async def high_water_marks(config: WaltzClientConfig, partitions: Sequence[int] | None) -> dict[int, int]:
    """The servers' high-water marks of ``partitions`` (None: every partition), in partition order
    (HIGH_WATER_MARK_REQUEST each)."""
    client = await _started(HighWaterMarks(), replace(config, auto_mount=False))
    try:
        wanted = range(client.num_partitions) if partitions is None else sorted(set(partitions))
        for partition_id in wanted:
            _check_partition(client, partition_id)
        return {partition_id: await client.high_water_mark(partition_id) for partition_id in wanted}
    finally:
        await client.close()


# --- tail ----------------------------------------------------------------------------------------


class TailedTransaction(NamedTuple):
    partition_id: int
    transaction_id: int
    header: int
    req_id: ReqId
    data: bytes | None

    def to_json(self) -> dict[str, Any]:
        """snake_case keys; with data, ``data_hex`` always and ``data`` as text (None unless UTF-8)."""
        value: dict[str, Any] = {
            "partition": self.partition_id,
            "transaction_id": self.transaction_id,
            "header": self.header,
            "client_id": self.req_id.client_id,
            "generation": self.req_id.generation,
            "seq_num": self.req_id.seq_num,
        }
        if self.data is not None:
            value["data"] = utf8_text(self.data)
            value["data_hex"] = self.data.hex()
        return value


def utf8_text(data: bytes) -> str | None:
    """``data`` as text when it is valid UTF-8, else None."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _TailCallbacks(HighWaterMarks):
    def __init__(self, with_data: bool) -> None:
        super().__init__()
        self.with_data = with_data
        self.queue: asyncio.Queue[TailedTransaction | AuthorizationError] = asyncio.Queue()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        if isinstance(exception, AuthorizationError):
            self.queue.put_nowait(exception)  # the feed ended: so does the tail, saying why
        else:
            super().uncaught_exception(partition_id, transaction_id, exception)

    async def on_transaction(self, transaction: Transaction) -> None:
        data = await transaction.data() if self.with_data else None
        self.queue.put_nowait(
            TailedTransaction(
                transaction.partition_id,
                transaction.transaction_id,
                transaction.header,
                transaction.req_id,
                data,
            )
        )


@dataclass(frozen=True)
class TailRange:
    """Which transactions a tail prints: ids ``from_transaction..to_transaction`` (inclusive; None:
    only new ones / no end), at most ``max_transactions`` in all (None: no limit)."""

    from_transaction: int | None = 0
    to_transaction: int | None = None
    max_transactions: int | None = None

    def __post_init__(self) -> None:
        if self.from_transaction is not None and self.from_transaction < 0:
            raise ClientToolError(f"--from must not be negative, got {self.from_transaction}")
        if self.to_transaction is not None and self.to_transaction < 0:
            raise ClientToolError(f"--to must not be negative, got {self.to_transaction}")
        if (
            self.from_transaction is not None
            and self.to_transaction is not None
            and self.to_transaction < self.from_transaction
        ):
            raise ClientToolError(f"--to {self.to_transaction} is before --from {self.from_transaction}")
        if self.max_transactions is not None and self.max_transactions < 1:
            raise ClientToolError(f"--max must be at least 1, got {self.max_transactions}")


async def tail(
    config: WaltzClientConfig,
    partitions: Sequence[int] | None,
    *,
    span: TailRange = TailRange(),
    follow: bool = True,
    with_data: bool = False,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    note: Callable[[str], None] = lambda _: None,
) -> AsyncGenerator[TailedTransaction, None]:
    """The transactions of ``partitions`` (None: every partition of the cluster) in ``span``, as
    they arrive (in order within a partition, interleaved across partitions).

    It ends when every partition reached ``span.to_transaction`` or, without ``follow``, the
    high-water mark read when it started (a feed then silent for ``timeout_ms`` is an error: the
    server went away), or after ``span.max_transactions``; otherwise it waits for ever. A
    ``span.from_transaction`` beyond a partition's high-water mark is waited for when following
    (as Kafka's consumer does); without ``follow`` that partition is skipped with a ``note``.
    """
    callbacks = _TailCallbacks(with_data)
    client = await _started(callbacks, replace(config, auto_mount=False))
    try:
        partition_ids = list(range(client.num_partitions)) if partitions is None else list(partitions)
        for partition_id in partition_ids:
            _check_partition(client, partition_id)
        last: dict[int, int] = {}  # partition → the last transaction id passed (the mount point)
        ends: dict[int, int] = {}  # partition → the last transaction id to print
        for partition_id in partition_ids:
            server_mark = await client.high_water_mark(partition_id)
            start = server_mark if span.from_transaction is None else span.from_transaction - 1
            if span.from_transaction is not None and span.from_transaction > server_mark and not follow:
                note(
                    f"partition {partition_id} skipped: its transactions are 0..{server_mark}, "
                    f"none at or after --from {span.from_transaction}"
                )
            # Mounted at most at the server's mark; what lies below --from is read and not printed.
            last[partition_id] = min(start, server_mark)
            ends[partition_id] = _tail_end(server_mark, span.to_transaction, follow)
        first = span.from_transaction or 0
        waiting = {p for p in partition_ids if max(last[p], first - 1) < ends[p]}
        if not waiting:
            return
        callbacks.marks.update({p: last[p] for p in waiting})
        await client.set_partitions(sorted(waiting))
        printed = 0
        while waiting and (span.max_transactions is None or printed < span.max_transactions):
            item = await _next_tailed(callbacks.queue, None if follow else timeout_ms, last, waiting)
            last[item.partition_id] = item.transaction_id
            if not first <= item.transaction_id <= ends[item.partition_id]:
                continue  # below --from, or past its end while others catch up
            if item.transaction_id == ends[item.partition_id]:
                waiting.discard(item.partition_id)
            printed += 1
            yield item
    finally:
        await client.close()


_NO_END = 2**63 - 1  # a transaction id no partition reaches: follow for ever


def _tail_end(server_mark: int, to_transaction: int | None, follow: bool) -> int:
    """The last transaction id a tail prints of a partition whose high-water mark is ``server_mark``."""
    end = _NO_END if follow else server_mark
    return end if to_transaction is None else min(end, to_transaction)


async def _next_tailed(
    queue: asyncio.Queue[TailedTransaction | AuthorizationError],
    timeout_ms: int | None,
    last: dict[int, int],
    waiting: set[int],
) -> TailedTransaction:
    try:
        async with asyncio.timeout(None if timeout_ms is None else timeout_ms / MS_PER_S):
            item = await queue.get()
        if isinstance(item, AuthorizationError):
            raise item
        return item
    except TimeoutError:
        behind = ", ".join(f"partition {p} after {last[p]}" for p in sorted(waiting))
        raise ClientToolError(
            f"no transaction within {timeout_ms} ms ({behind}); is the server up?"
        ) from None


# --- append --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendItem:
    data: bytes
    header: int = 0
    write_locks: tuple[PartitionLocalLock, ...] = ()


def parse_lock(text: str) -> PartitionLocalLock:
    """``NAME:ID`` (ID a long) → a write lock."""
    name, separator, lock_id = text.rpartition(":")
    try:
        if not separator or not name:
            raise ValueError
        return PartitionLocalLock(name, int(lock_id))
    except ValueError:
        raise ClientToolError(f"lock must be NAME:ID with an integer ID, got '{text}'") from None


class _AppendContext(TransactionContext):
    def __init__(self, partition_id: int, item: AppendItem, callbacks: _AppendCallbacks) -> None:
        super().__init__()
        self.target = partition_id
        self.item = item
        self.callbacks = callbacks
        self.transaction_id = NO_TRANSACTION
        self.result: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def partition_id(self, num_partitions: int) -> int:
        return self.target

    def execute(self, builder: TransactionBuilder) -> bool:
        self.callbacks.attempts[builder.req_id] = self  # every attempt has its own ReqId
        builder.set_header(self.item.header)
        builder.set_transaction_data(self.item.data)
        builder.set_write_locks(self.item.write_locks)
        return True

    def on_application(self) -> None:
        if not self.result.done():
            self.result.set_result(self.transaction_id)

    def on_exception(self, exception: BaseException) -> None:
        if not self.result.done():
            self.result.set_exception(exception)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a finished future's exception as seen (else asyncio logs "Future exception was never
    retrieved" with a traceback when it is collected)."""
    if future.done() and not future.cancelled():
        future.exception()


class _AppendCallbacks(HighWaterMarks):
    def __init__(self) -> None:
        super().__init__()
        self.attempts: dict[ReqId, _AppendContext] = {}

    async def on_transaction(self, transaction: Transaction) -> None:
        context = self.attempts.get(transaction.req_id)
        if context is not None:
            context.transaction_id = transaction.transaction_id
            for req_id in [r for r, c in self.attempts.items() if c is context]:
                del self.attempts[req_id]


async def append(
    config: WaltzClientConfig,
    partition_id: int,
    items: Iterable[AppendItem],
    *,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> AsyncGenerator[int, None]:
    """Append ``items`` one after the other; yields each committed transaction id."""
    callbacks = _AppendCallbacks()
    client = await _client_from(
        callbacks, replace(config, auto_mount=False), [partition_id], from_latest=True
    )
    try:
        for item in items:
            context = _AppendContext(partition_id, item, callbacks)
            try:
                await client.submit(context)
            except BaseException:
                # submit reported the failure to on_exception too, which put it on the context's
                # future; it is raised here, so the future's copy counts as retrieved.
                _retrieved(context.result)
                raise
            try:
                async with asyncio.timeout(RESULT_TIMEOUT_FACTOR * timeout_ms / MS_PER_S):
                    transaction_id = await context.result
            except TimeoutError:
                raise ClientToolError(
                    f"partition {partition_id}: append not decided within "
                    f"{RESULT_TIMEOUT_FACTOR * timeout_ms} ms"
                ) from None
            yield transaction_id  # outside the timeout: the consumer's time is not ours
    finally:
        await client.close()


# --- validate / producer / consumer (ClientCli) --------------------------------------------------


def exponential_delay_s(average_interval_ms: float, rng: random.Random) -> float:
    """``avgInterval * -ln(1 - U)``: Poisson arrivals, as the original's producers."""
    return average_interval_ms * -math.log(1.0 - rng.random()) / MS_PER_S


class _ValidateContext(TransactionContext):
    def __init__(self, partition_id: int, done: asyncio.Future[None]) -> None:
        super().__init__()
        self.target = partition_id
        self.done = done

    def partition_id(self, num_partitions: int) -> int:
        return self.target

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_transaction_data(VALIDATE_DATA.pack(builder.client_high_water_mark + 1))
        builder.set_write_locks([VALIDATE_LOCK])
        return True

    def on_completion(self, result: bool) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_exception(self, exception: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exception)


@dataclass
class ProducerSpec:
    txn_per_client: int
    interval_ms: float
    num_active_partitions: int = 1
    seed: int | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.txn_per_client < 0 or self.interval_ms < 0 or self.num_active_partitions < 1:
            raise ClientToolError("txn-per-client and interval must not be negative, active partitions >= 1")
        self.rng = random.Random(self.seed)


async def produce(
    config: WaltzClientConfig, spec: ProducerSpec, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> None:
    """One producer client (``create-producer``): ``txn_per_client`` validated transactions."""
    partitions = list(range(spec.num_active_partitions))
    callbacks = HighWaterMarks()
    client = await _client_from(callbacks, replace(config, auto_mount=False), partitions, from_latest=True)
    try:
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[None]] = []
        for _ in range(spec.txn_per_client):
            await asyncio.sleep(exponential_delay_s(spec.interval_ms, spec.rng))
            done: asyncio.Future[None] = loop.create_future()
            try:
                await client.submit(_ValidateContext(spec.rng.choice(partitions), done))
            except BaseException:
                _retrieved(done)  # the same failure is raised here
                raise
            pending.append(done)
        bound_s = RESULT_TIMEOUT_FACTOR * timeout_ms / MS_PER_S
        try:
            async with asyncio.timeout(bound_s + len(pending) * spec.interval_ms / MS_PER_S):
                await asyncio.gather(*pending)
        except TimeoutError:
            raise ValidationError("producer: transactions not committed in time") from None
        if callbacks.errors:
            raise ValidationError("; ".join(callbacks.errors))
    finally:
        await client.close()


class _ConsumerCallbacks(HighWaterMarks):
    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.consumed = 0
        self.progress = asyncio.Event()

    async def on_transaction(self, transaction: Transaction) -> None:
        expected_id = self.get_client_high_water_mark(transaction.partition_id) + 1
        if transaction.transaction_id != expected_id:
            self.errors.append(
                f"expect callback transaction id to be {expected_id}, but got {transaction.transaction_id}"
            )
        data = await transaction.data()
        if len(data) != VALIDATE_DATA.size or VALIDATE_DATA.unpack(data)[0] != transaction.transaction_id:
            self.errors.append(
                f"optimistic locking validation failed: partition {transaction.partition_id}, "
                f"transaction {transaction.transaction_id} has data {data[:16].hex()}"
            )
        self.consumed += 1
        self.progress.set()


async def consume(
    config: WaltzClientConfig,
    num_transactions: int,
    num_active_partitions: int = 1,
    idle_timeout_ms: int = DEFAULT_CONSUMER_IDLE_TIMEOUT_MS,
) -> None:
    """One consumer (``create-consumer``): read the active partitions from the start until
    ``num_transactions`` arrived, checking order and data == id; raises ValidationError."""
    callbacks = _ConsumerCallbacks(num_transactions)
    partitions = list(range(num_active_partitions))
    client = await _client_from(callbacks, replace(config, auto_mount=False), partitions, from_latest=False)
    try:
        while callbacks.consumed < num_transactions:
            callbacks.progress.clear()
            try:
                async with asyncio.timeout(idle_timeout_ms / MS_PER_S):
                    await callbacks.progress.wait()
            except TimeoutError:
                raise ValidationError(
                    f"consumer: {callbacks.consumed} of {num_transactions} transactions arrived; "
                    f"none in the last {idle_timeout_ms} ms"
                ) from None
        if callbacks.consumed != num_transactions:
            callbacks.errors.append(f"expected {num_transactions} transactions, got {callbacks.consumed}")
        if callbacks.errors:
            raise ValidationError("; ".join(callbacks.errors))
    finally:
        await client.close()


async def validate(
    config: WaltzClientConfig,
    txn_per_client: int,
    num_clients: int,
    interval_ms: float,
    num_active_partitions: int = 1,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> None:
    """``client validate``: N producers, then one consumer that must see every transaction of
    the active partitions (existing + tpc × nc) with data == id. Raises ValidationError with
    every problem found, prefixed "Transaction validation failed: "."""
    if num_clients < 1:
        raise ClientToolError("num-clients must be at least 1")
    marks = await high_water_marks(config, range(num_active_partitions))
    existing = sum(mark + 1 for mark in marks.values())
    results = await asyncio.gather(
        *(
            produce(config, ProducerSpec(txn_per_client, interval_ms, num_active_partitions), timeout_ms)
            for _ in range(num_clients)
        ),
        return_exceptions=True,
    )
    problems = [str(r) for r in results if isinstance(r, BaseException)]
    if not problems:
        try:
            await consume(config, existing + txn_per_client * num_clients, num_active_partitions)
        except WaltzError as e:
            problems.append(str(e))
    if problems:
        raise ValidationError("Transaction validation failed: " + "; ".join(problems))
