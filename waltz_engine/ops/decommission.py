"""`waltz storage decommission` as a library (issue 24 item 1): every replica a storage node
holds moves to other nodes, one partition at a time, while the log stays writable.

The moves are recorded in ZooKeeper before the first step (``zk.replica_moves``) and carried
out under the replica mover lease (one mover at a time: another decommission, or a server
re-replicating a lost node); running it again after a kill at any step finishes the job.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable
from typing import NamedTuple

from kazoo.client import KazooClient

from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig
from waltz_engine.storage import admin_ops
from waltz_engine.storage.network_reader import ClusterAccess
from waltz_engine.storage.replica_mover import (
    ReplicaMover,
    plan_moves,
    registered_name,
    settled_moves,
    under_way,
)
from waltz_engine.zk import replica_moves
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.replica_moves import REASON_DECOMMISSION, ReplicaMove

# The lease lives as long as the ZooKeeper session that took it: a decommission killed while
# holding it frees it this soon for a re-run.
LEASE_SESSION_TIMEOUT_MS = 10_000
# How long `--wait` waits for the lease another mover holds.
LEASE_WAIT_TIMEOUT_MS = 120_000


class DecommissionError(WaltzError):
    """The decommission cannot start or go on; the message says what to do."""


class DecommissionResult(NamedTuple):
    storage: str
    moves: list[ReplicaMove]  # what this run carried out or resumed
    unreleased: list[ReplicaMove]  # moved, but the node did not answer to be told so
    remaining: list[int]  # partitions the node still holds in the assignment

    def to_json(self) -> dict[str, object]:
        return {
            "storage": self.storage,
            "moves": [m.to_json() for m in self.moves],
            "unreleased": [m.to_json() for m in self.unreleased],
            "remaining_partitions": self.remaining,
        }


def decommission(
    settings: ZooKeeperSettings,
    ssl_context: ssl.SSLContext,
    storage: str,
    *,
    delete_files: bool = False,
    wait: bool = False,
    bytes_per_second: int = 0,
    timeout_ms: int = admin_ops.DEFAULT_TIMEOUT_MS,
    say: Callable[[str], None] = lambda _: None,
    tls: TlsConfig | None = None,
) -> DecommissionResult:
    """Move every replica ``storage`` (its data or admin address) holds to other nodes.

    ``wait``: wait for the mover lease that another process holds (else fail at once, naming
    it). ``delete_files``: the node deletes each moved partition's files (else keeps them).
    ``tls``: how to reach the servers (their committed high-water marks bound each copy).
    """
    admin_ops.parse_storage_address(storage)
    if bytes_per_second < 0:
        raise DecommissionError(f"bytes per second must be 0 (no bound) or more, got {bytes_per_second}")
    lease_settings = settings._replace(
        session_timeout_ms=min(settings.session_timeout_ms, LEASE_SESSION_TIMEOUT_MS)
    )
    with connect(lease_settings) as zk:
        root = settings.cluster_root
        layout = admin_ops.read_store_layout(zk, root)
        name = registered_name(layout, storage)
        holder = f"waltz storage decommission {name} (pid {os.getpid()} on {socket.gethostname()})"
        taken = (
            replica_moves.wait_lease(zk, root, holder, LEASE_WAIT_TIMEOUT_MS)
            if wait
            else replica_moves.try_lease(zk, root, holder)
        )
        if not taken:
            raise DecommissionError(
                f"another process moves replicas now ({replica_moves.lease_holder(zk, root)}); "
                + ("run again later" if wait else "add --wait to wait for it")
            )
        try:
            context = layout.context(ssl_context, timeout_ms)
            access = ClusterAccess(settings, tls or TlsConfig())
            mover = ReplicaMover(zk, root, context, bytes_per_second, say, access=access)
            return asyncio.run(_decommission(mover, zk, name, delete_files))
        finally:
            replica_moves.release_lease(zk, root)


async def _decommission(
    mover: ReplicaMover, zk: KazooClient, name: str, delete_files: bool
) -> DecommissionResult:
    layout = await mover.layout()
    recorded = await asyncio.to_thread(replica_moves.read_moves, zk, mover.root)
    live = await mover.live_nodes(layout)
    planned = plan_moves(
        layout,
        name,
        live - {name},
        reason=REASON_DECOMMISSION,
        delete_files=delete_files,
        skip=under_way(layout, recorded),
    )
    if planned:
        targets = ", ".join(f"{m.partition_id} to {m.target}" for m in planned)
        mover.say(f"{name}: moving partitions {targets}")
        for move in planned:
            mover.say(await mover.describe(layout, move))
    settled = settled_moves(layout, recorded)
    recorded = await asyncio.to_thread(replica_moves.add_moves, zk, mover.root, planned, settled)
    ours = sorted((m for m in recorded if m.source == name), key=lambda m: m.partition_id)
    unreleased = [m for m in ours if not await mover.run(m)]
    layout = await mover.layout()
    return DecommissionResult(name, ours, unreleased, sorted(layout.assignments.get(name, ())))
