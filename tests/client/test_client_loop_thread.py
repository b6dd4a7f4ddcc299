"""A blocking call into the client's loop never outlives the loop's thread.

A full-suite run hung in `examples/consumer.py` after Ctrl-C: a consumer thread asked for a
transaction's data while the client closed, the coroutine reached a loop that stopped before
running it, and the thread waited forever (the process cannot exit while the consumer pool's
threads run).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from waltz_engine.client.errors import ClientClosedError
from waltz_engine.client.loop_thread import call_on_loop
from waltz_engine.client.sync_client import _cancel_all

BOUND_S = 10.0  # a hang, not a speed: the call gives up within LOOP_CHECK_INTERVAL_S


def _loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def _call_in_a_thread(
    coroutine: object, loop: asyncio.AbstractEventLoop, thread: threading.Thread
) -> list[object]:
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(call_on_loop(coroutine, loop, thread))  # type: ignore[arg-type]
        except ClientClosedError as e:
            outcome.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(BOUND_S)
    assert not caller.is_alive(), "the call waited on a stopped loop"
    return outcome


def test_a_running_loop_answers() -> None:
    loop, thread = _loop_thread()
    try:
        assert _call_in_a_thread(asyncio.sleep(0, result=7), loop, thread) == [7]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(BOUND_S)
        loop.close()


def test_a_loop_stopped_before_running_the_call_gives_client_closed() -> None:
    loop, thread = _loop_thread()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(BOUND_S)
    # Stopped, not closed: the coroutine is accepted and would never run.
    [outcome] = _call_in_a_thread(asyncio.sleep(0, result=7), loop, thread)
    assert isinstance(outcome, ClientClosedError)
    loop.close()
    [outcome] = _call_in_a_thread(asyncio.sleep(0, result=7), loop, thread)
    assert isinstance(outcome, ClientClosedError)


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
def test_a_loop_that_stops_while_the_call_waits_gives_client_closed() -> None:
    loop, thread = _loop_thread()
    started = threading.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(3600)
        return 7

    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(call_on_loop(slow(), loop, thread))
        except ClientClosedError as e:
            outcome.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert started.wait(BOUND_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(BOUND_S)
    caller.join(BOUND_S)
    assert not caller.is_alive(), "the call waited on a stopped loop"
    assert isinstance(outcome[0], ClientClosedError)
    loop.close()


SECOND_CTRL_C = """
import asyncio, os, signal, threading, time
from waltz_engine.client import WaltzClientCallbacks
from waltz_engine.client.pytest_plugin import WaltzMockHarness

class Ignore(WaltzClientCallbacks):
    def get_client_high_water_mark(self, partition_id):
        return -1
    def apply_transaction(self, transaction):
        pass
    def uncaught_exception(self, partition_id, transaction_id, exception):
        pass

client = WaltzMockHarness().client(Ignore())
async def slow_close():
    await asyncio.sleep(60)
client._client.close = slow_close  # a close that waits on something slow
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
client.close()
print(f"closed in {time.monotonic() - started:.1f} s")
"""


def test_a_second_ctrl_c_during_close_gives_the_close_up_quietly() -> None:
    """A program's second Ctrl-C while `SyncWaltzClient.close` waits: no traceback, no
    "coroutine was never awaited"; close returns once the loop's tasks are cancelled (issue 31)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SECOND_CTRL_C], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.startswith("closed in"), done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "never awaited" not in done.stderr, done.stderr
    assert float(done.stdout.split()[2]) < BOUND_S


def test_close_returns_once_no_callback_runs_on_a_consumer_thread() -> None:
    """`SyncWaltzClient.close` waits for the transaction a consumer thread is applying: the
    application may then close what its callbacks use (a DB-API callbacks' close() closed an
    SQLite connection a consumer thread still applied with: a segfault in a full-suite run)."""
    from typing import Any

    from waltz_engine.client import TransactionContext, WaltzClientCallbacks
    from waltz_engine.client.pytest_plugin import WaltzMockHarness

    applying = threading.Event()
    applied: list[int] = []

    class Slow(WaltzClientCallbacks):
        def get_client_high_water_mark(self, partition_id: int) -> int:
            return -1

        def apply_transaction(self, transaction: Any) -> None:
            applying.set()
            threading.Event().wait(APPLY_S)
            applied.append(transaction.transaction_id)

    class One(TransactionContext):
        def partition_id(self, num_partitions: int) -> int:
            return 0

        def execute(self, builder: Any) -> bool:
            builder.set_transaction_data(b"x")
            return True

    harness = WaltzMockHarness()
    client = harness.client(Slow())
    client.submit(One())
    assert applying.wait(BOUND_S), "the transaction was fed"
    client.close()
    assert applied == [0], "close returned while a consumer thread still applied it"


APPLY_S = 0.5  # long enough that a close which does not wait returns first


def test_an_abandoned_close_also_ends_the_tasks_that_cancelled_tasks_start() -> None:
    """A network client's task, cancelled by an abandoned close, starts its reconnect as it ends;
    the reconnect is cancelled too, not left pending for the loop's close to destroy (the second
    Ctrl-C test failed once in 2 runs of tests/client under load: the reconnect ran on, was
    destroyed, and its ``finally`` printed a traceback)."""

    async def go() -> None:
        reconnects: list[asyncio.Task[None]] = []

        async def connection() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                reconnects.append(asyncio.create_task(asyncio.sleep(3600)))

        first = asyncio.create_task(connection())
        await asyncio.sleep(0)  # inside its try
        await _cancel_all(BOUND_S)
        assert first.cancelled() and reconnects[0].cancelled()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(go())
