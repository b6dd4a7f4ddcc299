"""The ``waltz_mock_client`` fixture and the blocking client, as an application test would use them."""

from __future__ import annotations

import threading

import pytest
from client_support.app import MockContext, StringSerializer

from waltz_engine.client import InvalidOperationError, Transaction, WaltzClientCallbacks

# The fixture comes from the package's pytest11 entry point, as it does for applications.

WAIT_S = 10


class BlockingCallbacks(WaltzClientCallbacks):
    """A threaded application: blocking data fetch inside apply_transaction (consumer threads)."""

    def __init__(self) -> None:
        self.high_water_mark = -1
        self.data: list[str] = []
        self.threads: set[str] = set()
        self.applied = threading.Event()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_mark

    def apply_transaction(self, transaction: Transaction) -> None:
        self.threads.add(threading.current_thread().name)
        self.data.append(transaction.get_data(StringSerializer()))
        self.high_water_mark = transaction.transaction_id
        self.applied.set()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        raise AssertionError(f"unexpected: {exception}")


def test_fixture_gives_sync_clients_on_shared_mock_partitions(waltz_mock_client) -> None:  # type: ignore[no-untyped-def]
    writer_callbacks, reader_callbacks = BlockingCallbacks(), BlockingCallbacks()
    writer = waltz_mock_client.client(writer_callbacks)
    reader = waltz_mock_client.client(reader_callbacks)
    assert writer.client_id != reader.client_id and writer.cluster_name == "mock"
    context = MockContext("hello")
    writer.submit(context)
    assert context.future.result(WAIT_S) is True
    assert reader_callbacks.applied.wait(WAIT_S)
    assert reader_callbacks.data == ["hello"]
    assert all(name.startswith("waltz-client-consumer") for name in reader_callbacks.threads)
    writer.flush()
    assert writer.high_water_mark(0) == 0 and not writer.has_pending_transactions()
    with pytest.raises(InvalidOperationError):
        writer.set_partitions({0})


def test_fixture_faults_reach_the_client(waltz_mock_client) -> None:  # type: ignore[no-untyped-def]
    client = waltz_mock_client.client(BlockingCallbacks())
    waltz_mock_client.driver.force_next_lock_fail()
    context = MockContext("x", retry=False)
    client.submit(context)
    assert context.lock_failure.result(WAIT_S) is True
    assert context.future.result(WAIT_S) is False
