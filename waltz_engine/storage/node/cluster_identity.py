"""Which cluster a storage node serves: ZooKeeper's ``<root>/store`` (key and partition count),
or, while ZooKeeper does not answer, the control file's header on its own disk.

The original reads ``StoreParams`` from ZooKeeper at start and needs ZooKeeper for nothing else
(reference §1.1, PR #62); a node that starts while ZooKeeper is out waits for it. Yet the control
file's header already holds both values, written from ZooKeeper when the directory was
formatted, and a running store session keeps committing through a ZooKeeper outage (the servers
need ZooKeeper only to open a new one). So a node that reboots during an outage (a power loss, a
kernel update) would leave its replicas away for the rest of the outage: with a second node down
the log stops, though every replica it needs has its disk (issue 32: the simulator's seed 41354,
two nodes powered off 0.3 ms apart held away 18.5 s by a 15 s outage).

Here a node whose directory holds a formatted control file starts from it when ZooKeeper does not
answer (one warning line says so), serves the replicas its control file assigns, and checks
ZooKeeper in the background until it answers (:class:`ZooKeeperCheck`):

- a cluster key or partition count there other than the disk's means the disk belongs to another
  cluster: the node refuses it as a start with ZooKeeper would (its ports close, the process
  exits 1). Until then the disk's key guards every connection (an OPEN with another key is
  refused), so no server of another cluster is ever served;
- a partition the control file assigns but ``store/assignment`` no longer gives this node (a
  replica moved away while the node was down and blind) is unassigned, its files kept, as
  ``storage sync-partitions`` would (a recorded move onto this node is left to its mover).

A new directory (no control file) has nothing to start from: it waits for ZooKeeper as before.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import NamedTuple

from waltz_engine.common import clock
from waltz_engine.common.backoff import Backoff
from waltz_engine.common.errors import StorageError, WaltzError
from waltz_engine.disk.file_header import HEADER_SIZE_BYTES, ControlFileHeader
from waltz_engine.storage.constants import CONTROL_FILE_NAME
from waltz_engine.storage.file_system import Disk
from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperError, ZooKeeperSettings, connect
from waltz_engine.zk.replica_moves import read_moves
from waltz_engine.zk.store_metadata import read_replica_assignments, read_store_params
from waltz_engine.zk.znodes import ClusterNotFoundError

log = logging.getLogger("waltz_engine.storage.node")

# The background check's retries while ZooKeeper stays out (a refused connection costs nothing).
CHECK_RETRY_INITIAL_MS = 200
CHECK_RETRY_MAX_MS = 2_000
CHECK_RETRY_JITTER = 0.25
# While ZooKeeper stays out, a reminder this often (a mistyped connect string looks the same).
STILL_WITHOUT_WARNING_INTERVAL_MS = 60_000
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class StoreIdentity(NamedTuple):
    key: uuid.UUID
    num_partitions: int


class ZooKeeperView(NamedTuple):
    """What a node started without ZooKeeper reads once it answers."""

    params: StoreIdentity
    assigned: tuple[int, ...] | None  # store/assignment's partitions of this node; None: not registered
    moving_here: frozenset[int]  # partitions a recorded move brings onto this node


def disk_params(disk: Disk, directory: Path) -> StoreIdentity | None:
    """The control file's key and partition count; None when the directory is not formatted
    (no control file, or one shorter than its header, or a header that does not decode: the
    start with ZooKeeper reports what is wrong with it)."""
    path = directory / CONTROL_FILE_NAME
    if not disk.exists(path):
        return None
    file = disk.open(path)
    try:
        data = file.pread(HEADER_SIZE_BYTES, 0)
    finally:
        file.close()
    if len(data) < HEADER_SIZE_BYTES:
        return None
    try:
        header = ControlFileHeader.from_bytes(data)
    except WaltzError:
        return None
    return StoreIdentity(header.key, header.num_partitions)


def read_params(settings: ZooKeeperSettings, connector: ZooKeeperConnector) -> StoreIdentity:
    """``<root>/store`` (blocking); a reachable ZooKeeper without the cluster is a StorageError."""
    try:
        with connect(settings, connector) as client:
            params = read_store_params(client, settings.cluster_root)
    except ClusterNotFoundError as e:
        raise StorageError(
            f"no cluster at {settings.cluster_root} in ZooKeeper {settings.connect_string} ({e}); "
            "create it first (waltz create-cluster)"
        ) from None
    return StoreIdentity(params.key, params.num_partitions)


def read_view(
    settings: ZooKeeperSettings, connector: ZooKeeperConnector, names: Collection[str]
) -> ZooKeeperView:
    """The store params, this node's assignment (under any of ``names``) and the moves onto it."""
    root = settings.cluster_root
    try:
        with connect(settings, connector) as client:
            params = read_store_params(client, root)
            assignments = read_replica_assignments(client, root).as_dict()
            moves = read_moves(client, root)
    except ClusterNotFoundError as e:
        raise StorageError(f"no cluster at {root} in ZooKeeper {settings.connect_string} ({e})") from None
    mine = [assignments[name] for name in names if name in assignments]
    return ZooKeeperView(
        StoreIdentity(params.key, params.num_partitions),
        tuple(sorted({p for partitions in mine for p in partitions})) if mine else None,
        frozenset(m.partition_id for m in moves if m.target in names),
    )


def node_names(host: str, port: int) -> tuple[str, ...]:
    """The data connect strings this node may be registered under in ``store/assignment``."""
    if host not in WILDCARD_HOSTS:
        return (f"{host}:{port}",)
    return tuple(dict.fromkeys(f"{name}:{port}" for name in (socket.gethostname(), socket.getfqdn())))


def another_cluster(on_disk: StoreIdentity, in_zookeeper: StoreIdentity, root: str) -> str | None:
    """Why the disk is not this cluster's, or None."""
    if on_disk.key != in_zookeeper.key:
        return (
            f"the cluster key does not match (the disk has {on_disk.key}, "
            f"ZooKeeper's {root} {in_zookeeper.key})"
        )
    if on_disk.num_partitions != in_zookeeper.num_partitions:
        return (
            f"the number of partitions does not match (the disk has {on_disk.num_partitions}, "
            f"ZooKeeper's {root} {in_zookeeper.num_partitions})"
        )
    return None


def no_longer_assigned(view: ZooKeeperView, held: Collection[int]) -> list[int]:
    """Partitions this node holds assigned that ZooKeeper no longer gives it (a node that is not
    registered under its own name is left as it is: its name may differ, not its partitions)."""
    if view.assigned is None:
        return []
    return sorted(set(held) - set(view.assigned) - view.moving_here)


class ZooKeeperCheck:
    """The background check of a node started without ZooKeeper: retried until ZooKeeper answers,
    then once. ``refuse`` stops the node for a disk of another cluster; ``unassign`` takes back
    what ZooKeeper no longer assigns this node."""

    def __init__(
        self,
        settings: ZooKeeperSettings,
        connector: ZooKeeperConnector,
        on_disk: StoreIdentity,
        names: Collection[str],
        held: Callable[[], Collection[int]],
        unassign: Callable[[list[int]], Awaitable[None]],
        refuse: Callable[[StorageError], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._connector = connector
        self._on_disk = on_disk
        self._names = tuple(names)
        self._held = held
        self._unassign = unassign
        self._refuse = refuse
        self._started_s = clock.monotonic_s()
        self.confirmed = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        assert self.task is None
        self.task = asyncio.create_task(self._run(), name="zookeeper-check")

    async def _run(self) -> None:
        backoff = Backoff(CHECK_RETRY_INITIAL_MS, CHECK_RETRY_MAX_MS, jitter=CHECK_RETRY_JITTER)
        root = self._settings.cluster_root
        warned_s = self._started_s
        while True:
            await asyncio.sleep(backoff.next_delay_ms() / 1000)
            # What the node holds is taken before ZooKeeper is read: a move onto this node is
            # recorded there before its target is assigned, so a partition assigned after this
            # look is never taken back, and one assigned before it by a move is in the view.
            held = list(self._held())
            try:
                view = await asyncio.to_thread(read_view, self._settings, self._connector, self._names)
            except ZooKeeperError as e:
                now_s = clock.monotonic_s()
                if (now_s - warned_s) * 1000 >= STILL_WITHOUT_WARNING_INTERVAL_MS:
                    warned_s = now_s
                    log.warning(
                        "still without ZooKeeper after %d ms (%s): serving the disk's replicas; "
                        "check zookeeper.connectString if ZooKeeper is up",
                        int((now_s - self._started_s) * 1000),
                        e,
                    )
                continue
            except StorageError as e:
                await self._refuse(StorageError(f"ZooKeeper answers, but {e}: this disk's cluster is gone"))
                return
            except WaltzError as e:  # a znode that does not decode: asked again, never acted on
                log.warning("cannot check this node's cluster in ZooKeeper: %s; retrying", e)
                continue
            break
        why = another_cluster(self._on_disk, view.params, root)
        if why is not None:
            await self._refuse(
                StorageError(f"ZooKeeper answers, but {why}: the disk belongs to another cluster")
            )
            return
        away_ms = int((clock.monotonic_s() - self._started_s) * 1000)
        gone = no_longer_assigned(view, held)
        if gone:
            await self._unassign(gone)
        self.confirmed = True
        log.info(
            "ZooKeeper answers after %d ms: cluster %s, key %s confirmed%s",
            away_ms,
            root,
            view.params.key,
            f"; partitions {gone} are no longer assigned to this node there: unassigned, files kept"
            if gone
            else ("" if view.assigned is not None else f"; this node is not in {root}/store/assignment"),
        )
