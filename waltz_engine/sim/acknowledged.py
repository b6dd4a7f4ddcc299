"""What a storage node acknowledged must survive its power loss (issue 33): the world notes each
partition worker's span when the power goes (a span moves only once its records are durable, by
the file's own sync or the disk pass's whole-disk sync, and before they are answered) and checks
the node's disk against it once the node has restarted, before any request reached that disk."""

from __future__ import annotations

from waltz_engine.storage.node.node import METRIC_GROUP, StorageNode

# A restarted storage node's disk passes and the batches its connections ran outside them: before
# either, no request has touched its disk (a recovery's truncate may rightly cut acknowledged
# records that were never committed).
REQUEST_WRITE_COUNTERS = ("disk-passes", "disk-connection-thread-batches")


class Acknowledged:
    """Per storage host, what it had acknowledged at its last power loss; the losses found."""

    def __init__(self) -> None:
        self._noted: dict[str, dict[int, int]] = {}
        self.violations: list[str] = []

    def note(self, host: str, node: StorageNode | None) -> None:
        """``host``'s power goes now (``node``: its process, if it started)."""
        if node is not None and node.manager is not None:
            self._noted[host] = {p: worker.max_transaction_id for p, worker in node.workers.items()}

    def check(self, host: str, node: StorageNode, rotten: bool) -> None:
        """``host`` restarted as ``node``: every record it had acknowledged is on its disk (a
        replica the world rotted may be cut by its recovery: ``rotten`` leaves it out)."""
        noted = self._noted.pop(host, {})
        manager = node.manager
        if rotten or manager is None:
            return
        if any(node.metrics.counter(METRIC_GROUP, name).count for name in REQUEST_WRITE_COUNTERS):
            return  # a request reached its disk first
        for partition_id in sorted(set(noted) & set(manager.assigned_partition_ids())):
            held = manager.partition(partition_id).max_transaction_id()
            if held < noted[partition_id]:
                self.violations.append(
                    f"{host}: partition {partition_id} holds up to txid {held} after a power loss, "
                    f"but had acknowledged up to {noted[partition_id]}"
                )
