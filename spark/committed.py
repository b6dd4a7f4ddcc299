"""How far each partition is committed: the bound no read may pass.

With ZooKeeper, a Waltz client asks the servers (HIGH_WATER_MARK_REQUEST): the server's
high-water mark is the last transaction it committed. Without ZooKeeper the only committed
fact on a storage node's disk is its control file's low-water mark (the last txid the
server checkpointed as committed to it), which may lag the log by a session or more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from spark.layout import NO_TRANSACTION, Replica
from waltz_engine.client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_engine.client.transaction import Transaction
from waltz_engine.zk.connection import ZooKeeperSettings

# Bounds every wait on the cluster (connect, RPC) of a high-water-mark query.
QUERY_TIMEOUT_MS = 15_000


class _NoFeed(WaltzClientCallbacks):
    """A client that mounts nothing: it only asks questions."""

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return NO_TRANSACTION

    def apply_transaction(self, transaction: Transaction) -> None:
        return None

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        return None


async def _high_water_marks(settings: ZooKeeperSettings, partitions: Sequence[int] | None) -> dict[int, int]:
    config = WaltzClientConfig(
        zookeeper=settings,
        auto_mount=False,
        registration_timeout_ms=QUERY_TIMEOUT_MS,
        ensure_mounted_timeout_ms=QUERY_TIMEOUT_MS,
        rpc_timeout_ms=QUERY_TIMEOUT_MS,
    )
    client = await WaltzClient.create(_NoFeed(), config)
    try:
        wanted = range(client.num_partitions) if partitions is None else partitions
        return {p: await client.high_water_mark(p) for p in wanted if 0 <= p < client.num_partitions}
    finally:
        await client.close()


def server_high_water_marks(
    settings: ZooKeeperSettings, partitions: Sequence[int] | None = None
) -> dict[int, int]:
    """The committed high-water mark of each partition (all of the cluster's by default)."""
    return asyncio.run(_high_water_marks(settings, partitions))


def control_low_water_marks(replicas: Mapping[int, Iterable[Replica]]) -> dict[int, int]:
    """Per partition, the highest low-water mark any given directory's control file records."""
    return {p: max((r.low_water_mark for r in rs), default=NO_TRANSACTION) for p, rs in replicas.items()}
