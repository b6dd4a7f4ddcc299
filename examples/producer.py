"""Append each command-line argument to Waltz as one transaction, and wait until they are in the log.

Against a local cluster (``waltz dev up`` writes ``.waltz-dev/client.yml``, found from its directory
or any below it; ``--config FILE`` for another cluster)::

    python examples/producer.py hello world
    python examples/consumer.py          # prints them
"""

from __future__ import annotations

import argparse
import concurrent.futures
import zlib

from waltz_engine.client import (
    SyncWaltzClient,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
)

APPEND_TIMEOUT_S = 30.0


class Message(TransactionContext):
    """One transaction: the message as its data. The client calls ``execute`` again on a retry."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.appended: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def partition_id(self, num_partitions: int) -> int:
        # Any stable choice works; messages of one partition are read back in order.
        return zlib.crc32(self.text.encode()) % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_transaction_data(self.text.encode())
        return True  # no locks: messages never conflict

    def on_completion(self, result: bool) -> None:
        self.appended.set_result(result)  # True: it is in the log (replicated to the storage nodes)

    def on_exception(self, exception: BaseException) -> None:
        self.appended.set_exception(exception)


class IgnoreFeed(WaltzClientCallbacks):
    """A producer keeps no state: it starts at -1 and ignores what the log feeds it.

    The feed carries transaction ids and headers only (data is fetched on demand), so that is
    cheap; the client needs the feed to tell which of its appends made it.
    """

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction: Transaction) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="client YAML (default: the nearest dev cluster)")
    parser.add_argument("messages", nargs="+")
    args = parser.parse_args()

    with SyncWaltzClient(IgnoreFeed(), args.config) as client:
        messages = [Message(text) for text in args.messages]
        for message in messages:
            client.submit(message)  # returns once sent; the outcome arrives through the hooks
        client.flush()  # every message decided: committed, or certainly not (README's contract)
        for message in messages:
            appended = message.appended.result(APPEND_TIMEOUT_S)
            print(f"{'appended' if appended else 'not appended'}: {message.text}")


if __name__ == "__main__":
    main()
