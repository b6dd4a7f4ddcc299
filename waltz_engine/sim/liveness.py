"""The simulator's liveness check: a partition whose replicas of record can answer commits.

Safety checks ask what the log holds after a seed; this one asks whether the log moved while it
could. Every ``SAMPLE_MS`` of virtual time it looks at each partition: the server that serves
it (alive, not cut off, its ZooKeeper session heard, the newest generation among the servers
holding it), the appends that server holds undecided (queued, in the append task or in flight
to the store), and the replicas of record: the storage nodes of the latest store session a
recovery recorded in ZooKeeper (``PartitionMetadata.latest_recorded_storages``, as the servers'
recovery reads them; the assignment while none is recorded). When a quorum of those replicas
is up (powered, not crashed or gone, its disk not full) and reachable from the server both
ways, the server is up, ZooKeeper answers, and appends are pending, the partition owes a commit.
A span in which it owes one and none commits (no server's commit high-water mark of it
rises) that lasts longer than :data:`LIVENESS_BOUND_MS` is a violation naming the partition,
the span and the replicas. Any break in the conditions (a replica of the quorum lost, the
server out, nothing pending) ends the span: the bound is on progress under a working quorum.

The bound, from the product's own timeouts (the server's defaults, which the world keeps):

- a replica that stalls without refusing (a frozen link) holds a request of the store session
  up to the storage client's request timeout (``DEFAULT_REQUEST_TIMEOUT_MS``, 30 s) before the
  session fails over;
- the session is then reopened with a backoff of at most the store's maximum retry interval
  (``storage.maxRetryInterval``, 20 s);
- and a server whose ZooKeeper session ended is replaced within the session timeout (10 s in
  the world) before the next one mounts the partition and recovers;

so a working quorum commits within the sum, 60 s, where every wait is taken once. A longer
span is a stall the product does not recover from by itself: in practice a quorum the
recovery cannot count (the last session's bug: a move that ended before a recovery recorded
the replicas without its source, with one that stays then lost for good).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from waltz_engine.server.store.config import DEFAULT_MAX_RETRY_INTERVAL_MS
from waltz_engine.sim.loop import START_MONOTONIC_S
from waltz_engine.sim.world_constants import SESSION_TIMEOUT_MS
from waltz_engine.storage.client import DEFAULT_REQUEST_TIMEOUT_MS
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import PartitionMetadata, ReplicaAssignments

if TYPE_CHECKING:
    from waltz_engine.server.partition import Partition
    from waltz_engine.sim.world import SimWorld

LIVENESS_BOUND_MS = DEFAULT_REQUEST_TIMEOUT_MS + DEFAULT_MAX_RETRY_INTERVAL_MS + SESSION_TIMEOUT_MS
# How often the check looks (virtual time): a span is measured to within this.
SAMPLE_MS = 500


@dataclass
class _Span:
    started_s: float
    high_water_mark: int
    replicas: tuple[str, ...]  # the replicas of record
    answering: tuple[str, ...]  # those of them up and reachable (a quorum)
    reported: bool = False


class Liveness:
    """Samples a world's partitions on its loop (reading state only: it changes no schedule)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.violations: list[str] = []
        self._spans: dict[int, _Span] = {}
        self._high_water_marks: dict[int, int] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._stopped = False
        self._paths = ClusterPaths.of(world.settings.cluster_root)

    def start(self) -> None:
        self._handle = self.world.loop.call_later(SAMPLE_MS / 1000, self._tick)

    def stop(self) -> None:
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        if self._stopped:
            return
        for partition_id in range(self.world.shape.partitions):
            self.sample(partition_id)
        self._handle = self.world.loop.call_later(SAMPLE_MS / 1000, self._tick)

    # --- what the world looks like now -------------------------------------------------------

    def recorded_replicas(self, partition_id: int) -> set[str]:
        """The storage hosts of the partition's replicas of record (ZooKeeper's znode, read
        from the model directly: no session, no turn)."""
        znodes = self.world.zookeeper._nodes
        node = znodes.get(self._paths.partition(partition_id))
        recorded = None
        if node is not None and node.data:
            recorded = PartitionMetadata.from_bytes(node.data).latest_recorded_storages()
        if recorded is None:
            recorded = {storage for storage, ids in self._assignment() if partition_id in ids}
        return {storage.split(":")[0] for storage in recorded}

    def assigned_hosts(self) -> set[str]:
        """The storage hosts the assignment gives any partition to (the model's znode)."""
        return {storage.split(":")[0] for storage, ids in self._assignment() if ids}

    def gone_still_assigned(self) -> set[str]:
        """The storage hosts lost for good that the assignment still gives partitions to (their
        replicas not moved by auto-recovery yet)."""
        gone = {f"storage-{number}" for number in self.world.gone}
        return gone & self.assigned_hosts() if gone else set()

    def _assignment(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The assignment znode's (storage, partition ids) pairs, read from the model directly."""
        assignment = self.world.zookeeper._nodes.get(self._paths.assignment)
        if assignment is None or not assignment.data:
            return ()
        return ReplicaAssignments.from_bytes(assignment.data).replicas

    def _server(self, partition_id: int) -> tuple[str, Partition] | None:
        """The server serving the partition (the newest generation among those up holding it)."""
        world = self.world
        best: tuple[str, Partition] | None = None
        for number, server in enumerate(world.servers):
            host = f"server-{number}"
            core = server.core
            if number in world.paused or host in world.dead or core is None:
                continue
            partition = core.partitions.get(partition_id)
            zk = world._server_zookeeper(number)
            if partition is None or partition.closed or zk is None or not world.zookeeper.reachable(zk):
                continue
            if best is None or partition.generation > best[1].generation:
                best = (host, partition)
        return best

    def _answers(self, server: str, storage: str) -> bool:
        world = self.world
        number = int(storage.rsplit("-", 1)[1])
        if storage in world.dead or number in world.storage_down or number in world.gone:
            return False
        disk = world.disks.get(storage)
        if disk is None or disk.capacity_bytes is not None:
            return False  # (a full disk answers every append with an error)
        links = world.network._links
        both = (links.get((server, storage)), links.get((storage, server)))
        return not any(link is not None and link.blocked for link in both)

    def sample(self, partition_id: int) -> None:
        world = self.world
        now_s = world.loop.time()
        high_water_mark = max(
            (
                partition.commit_high_water_mark
                for server in world.servers
                if server.core is not None
                for pid, partition in server.core.partitions.items()
                if pid == partition_id
            ),
            default=-1,
        )
        seen = self._high_water_marks.get(partition_id, -1)
        progressed = high_water_mark > seen
        self._high_water_marks[partition_id] = max(high_water_mark, seen)
        served = None if world.zookeeper.in_outage else self._server(partition_id)
        owed = False
        replicas: tuple[str, ...] = ()
        answering: tuple[str, ...] = ()
        if served is not None:
            host, partition = served
            pending = partition.pending_appends > 0 or partition.append_queue_size() > 0
            recorded = sorted(self.recorded_replicas(partition_id))
            answering = tuple(s for s in recorded if self._answers(host, s))
            owed = pending and len(answering) >= len(recorded) // 2 + 1
            replicas = tuple(recorded)
        span = self._spans.get(partition_id)
        mark = self._high_water_marks[partition_id]
        if not owed or progressed:
            self._spans.pop(partition_id, None)
            if owed:
                self._spans[partition_id] = _Span(now_s, mark, replicas, answering)
            return
        if span is None:
            self._spans[partition_id] = _Span(now_s, mark, replicas, answering)
            return
        lasted_ms = (now_s - span.started_s) * 1000
        if lasted_ms > LIVENESS_BOUND_MS and not span.reported:
            span.reported = True
            assert served is not None
            start = span.started_s - START_MONOTONIC_S
            self.violations.append(
                f"partition {partition_id} committed nothing for {lasted_ms / 1000:.1f} s (from "
                f"{start:.1f} s, bound {LIVENESS_BOUND_MS / 1000:.0f} s, high-water mark "
                f"{span.high_water_mark}) while appends were pending on {served[0]} and a quorum of "
                f"its replicas of record ({', '.join(span.replicas)}) was up and reachable from it "
                f"({', '.join(span.answering)})"
            )
