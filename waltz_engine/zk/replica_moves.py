"""The replica moves under way and the lease of the one process that carries them out (issue 24).

Both are znodes of our own under ``<root>/replicaMoves`` (Java nodes never read them): the
persistent znode holds the moves as JSON, written with compare-and-set, so a mover killed at
any step leaves what it was doing for the next one to finish; its ephemeral child ``lease``
names the process moving replicas now, so two movers (a decommission, a server re-replicating
a lost node) never move the same partition at once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.znodes import ClusterMetadataError

MOVES_FORMAT_VERSION = 1
# A lost compare-and-set is read and tried again, at most this many times.
MOVES_CAS_ATTEMPTS = 20
LEASE_POLL_INTERVAL_MS = 200

REASON_DECOMMISSION = "decommission"
REASON_AUTO_RECOVERY = "auto-recovery"


class ReplicaMove(NamedTuple):
    """Move ``partition_id``'s replica from ``source`` to ``target`` (data connect strings)."""

    partition_id: int
    source: str
    target: str
    reason: str = REASON_DECOMMISSION
    delete_files: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "partition": self.partition_id,
            "from": self.source,
            "to": self.target,
            "reason": self.reason,
            "delete_files": self.delete_files,
        }

    @classmethod
    def from_json(cls, item: dict[str, object]) -> ReplicaMove:
        partition, source, target = item["partition"], item["from"], item["to"]
        if not isinstance(partition, int) or not isinstance(source, str) or not isinstance(target, str):
            raise ValueError(f"not a replica move: {item}")
        reason = str(item.get("reason", REASON_DECOMMISSION))
        return cls(partition, source, target, reason, bool(item.get("delete_files")))


def _decode(path: str, data: bytes | None) -> list[ReplicaMove]:
    if not data:
        return []
    try:
        document = json.loads(data)
        return [ReplicaMove.from_json(item) for item in document["moves"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ClusterMetadataError(f"znode {path} holds no replica moves this version reads: {e}") from None


def _encode(moves: Iterable[ReplicaMove]) -> bytes:
    document = {"version": MOVES_FORMAT_VERSION, "moves": [m.to_json() for m in moves]}
    return json.dumps(document, sort_keys=True).encode()


def read_moves(client: KazooClient, root: str) -> list[ReplicaMove]:
    path = ClusterPaths.of(root).replica_moves
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return []
    return _decode(path, data)


def update_moves(
    client: KazooClient, root: str, change: Callable[[list[ReplicaMove]], list[ReplicaMove]]
) -> list[ReplicaMove]:
    """Apply ``change`` to the moves with compare-and-set (read again on a lost race)."""
    path = ClusterPaths.of(root).replica_moves
    for _ in range(MOVES_CAS_ATTEMPTS):
        try:
            data, stat = client.get(path)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                client.create(path, _encode([]), makepath=True)
            continue
        current = _decode(path, data)
        updated = change(list(current))
        if updated == current:
            return current
        try:
            client.set(path, _encode(updated), version=stat.version)
            return updated
        except BadVersionError:
            continue
    raise ClusterMetadataError(f"znode {path} kept changing under {MOVES_CAS_ATTEMPTS} attempts; retry")


def add_moves(
    client: KazooClient, root: str, moves: Iterable[ReplicaMove], settled: Collection[ReplicaMove] = ()
) -> list[ReplicaMove]:
    """Record moves; a partition that has a move already keeps it (a re-run resumes it), unless
    that move is ``settled`` (all left of it is telling its source node, which may never answer).
    A settled move whose source node a new move of its partition targets is dropped: that node
    takes the partition again, and running the old move again would take it out of the
    assignment (issue 32: the simulator's seed 64 ended with 2 replicas)."""
    wanted = list(moves)

    def change(current: list[ReplicaMove]) -> list[ReplicaMove]:
        moving = {m.partition_id for m in current if m not in settled}
        added = [m for m in wanted if m.partition_id not in moving]
        back = {(m.partition_id, m.target) for m in added}
        kept = [m for m in current if not (m in settled and (m.partition_id, m.source) in back)]
        return kept + added

    return update_moves(client, root, change)


def finish_move(client: KazooClient, root: str, move: ReplicaMove) -> None:
    update_moves(client, root, lambda current: [m for m in current if m != move])


def replace_move(client: KazooClient, root: str, move: ReplicaMove, by: ReplicaMove) -> None:
    """``by`` in place of ``move`` (a mover taking over a stale move), if it is still recorded."""
    update_moves(client, root, lambda current: [by if m == move else m for m in current])


# --- the lease -----------------------------------------------------------------------------------


def lease_holder(client: KazooClient, root: str) -> str | None:
    try:
        data, _ = client.get(ClusterPaths.of(root).replica_mover_lease)
    except NoNodeError:
        return None
    return data.decode(errors="replace") if data else "(unnamed)"


def try_lease(client: KazooClient, root: str, holder: str) -> bool:
    """Take the lease if nobody holds it; it lasts while this ZooKeeper session does."""
    paths = ClusterPaths.of(root)
    if client.exists(paths.replica_moves) is None:
        update_moves(client, root, lambda current: current)  # creates the parent
    try:
        client.create(paths.replica_mover_lease, holder.encode(), ephemeral=True)
        return True
    except NodeExistsError:
        return False


def wait_lease(client: KazooClient, root: str, holder: str, timeout_ms: int) -> bool:
    """Take the lease, waiting up to ``timeout_ms`` for its holder to release it or its
    session to expire (a mover killed with it)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not try_lease(client, root, holder):
        if time.monotonic() >= deadline:
            return False
        time.sleep(LEASE_POLL_INTERVAL_MS / 1000)
    return True


class LeaseLostError(ClusterMetadataError):
    """This process no longer holds the mover lease: its ZooKeeper session expired (kazoo goes on
    in a new session, without the ephemeral lease), so another mover may hold it now."""


def holds_lease(client: KazooClient, root: str) -> bool:
    """Whether this client's current ZooKeeper session owns the lease znode."""
    stat = client.exists(ClusterPaths.of(root).replica_mover_lease)
    session = client.client_id
    return stat is not None and session is not None and stat.ephemeralOwner == session[0]


def check_lease(client: KazooClient, root: str) -> None:
    """Raise :class:`LeaseLostError` unless this session still holds the lease: what a mover
    asks before each step that changes the cluster (the fence: a holder whose session expired
    while it waited, for a copy or through a ZooKeeper outage, must stop, not act beside the
    mover that took the lease since; issue 32: the simulator's seed 60055)."""
    if not holds_lease(client, root):
        raise LeaseLostError(
            f"the replica mover lease was lost with this process's ZooKeeper session (now held by "
            f"{lease_holder(client, root) or 'nobody'}): stopped; run again to resume the moves"
        )


def release_lease(client: KazooClient, root: str) -> None:
    """Give the lease back, if this session holds it (never another's)."""
    path = ClusterPaths.of(root).replica_mover_lease
    stat = client.exists(path)
    if stat is None or stat.ephemeralOwner != client.client_id[0]:
        return
    with contextlib.suppress(NoNodeError, BadVersionError):
        client.delete(path, version=stat.version)
