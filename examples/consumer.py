"""Print every transaction in the Waltz log, then every new one as it arrives (Ctrl-C stops).

Against a local cluster (``waltz dev up`` writes ``.waltz-dev/client.yml``)::

    python examples/consumer.py
    python examples/producer.py hello   # in another terminal

This consumer keeps its high-water marks in memory, so each run starts from the beginning.
An application that must not apply a transaction twice stores them with its state, in one
database transaction: see ``waltz_engine/client/dbapi_callbacks.py`` and ``examples/bank``.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

from waltz_engine.client import SyncWaltzClient, Transaction, WaltzClientCallbacks

NO_TRANSACTION = -1
IDLE_STEP_S = 0.5


class PrintingCallbacks(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.high_water_marks: dict[int, int] = {}
        self.lock = threading.Lock()  # partitions are applied on several consumer threads

    def get_client_high_water_mark(self, partition_id: int) -> int:
        # Where the feed starts: after the last transaction applied (-1: from the beginning).
        with self.lock:
            return self.high_water_marks.get(partition_id, NO_TRANSACTION)

    def apply_transaction(self, transaction: Transaction) -> None:
        # Called once per transaction, in transaction id order within a partition. The data is
        # not in the feed: get_data() fetches it from the server (blocking is fine here).
        text = transaction.get_data().decode(errors="replace")
        print(
            f"partition {transaction.partition_id} transaction {transaction.transaction_id}: {text}",
            flush=True,
        )
        with self.lock:
            self.high_water_marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        # apply_transaction raised: the client reconnects and feeds the transaction again.
        print(f"partition {partition_id} transaction {transaction_id} failed: {exception}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="client YAML (default: the nearest dev cluster)")
    args = parser.parse_args()

    # The client mounts every partition and the feed starts; Ctrl-C closes it. The main thread
    # sleeps in steps: the kernel may hand SIGINT to one of the client's threads, and a wait
    # with no timeout would then never return to let Python raise KeyboardInterrupt.
    with SyncWaltzClient(PrintingCallbacks(), args.config), contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(IDLE_STEP_S)


if __name__ == "__main__":
    main()
