"""Cluster membership and partition assignment over ZooKeeper (zktools ``ClusterManagerImpl``, §2.3).

Every process watches ``<root>/serverDescriptors`` (its data, its children and each child's data).
The stored assignment is *consistent* when its ``cversion`` equals the znode's child version;
otherwise the coordinator — a locally managed server holding the smallest live server id —
computes a new one with :mod:`assignment_policy` and writes it with compare-and-set on the
znode version (a lost race is dropped: whoever won changed the cluster). Consistent states go
to the callbacks; a ``ClusterWatcher`` is the client side, a ``ClusterManager`` also manages
one server.

kazoo calls watches on its own threads, so they only wake the manager's task through
``loop.call_soon_threadsafe``; all reads, decisions and callbacks happen in that one task
(blocking kazoo calls run in worker threads), serialised with ``manage``/``unmanage``.

Our extension: forced assignments in ``<root>/forcedAssignments`` (see ``ForcedAssignments``).
The coordinator also recomputes when a binding forced assignment is not honoured or when the
forced set changed since it last wrote, so removing one rebalances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from waltz_engine.common.errors import FormatError, WaltzError
from waltz_engine.common.tasks import cancel_and_wait
from waltz_engine.net import transport
from waltz_engine.zk import assignment_policy
from waltz_engine.zk.cluster import next_server_id, read_cluster_params
from waltz_engine.zk.paths import ClusterPaths
from waltz_engine.zk.payloads import ForcedAssignments, PartitionAssignment, PartitionInfo, ServerDescriptor
from waltz_engine.zk.stale_registrations import remove_stale_registrations
from waltz_engine.zk.znodes import ConcurrentUpdateError

logger = logging.getLogger(__name__)

FIRST_SERVER_ID = 1  # ids/server starts at 0 and hands out value + 1
ABSENT_VERSION = -1  # version we report for a forcedAssignments znode that does not exist
MAX_CAS_ATTEMPTS = 32  # compare-and-set retries before calling the contention a failure
MAX_READ_ATTEMPTS = 3  # a znode created or deleted between two reads of one snapshot

OnPartitions = Callable[[list[PartitionInfo]], None]
OnEndpoints = Callable[[dict[str, list[PartitionInfo]]], None]
OnServerRemoved = Callable[[str], None]
Watch = Callable[[Any], None]


class ClusterManagerError(WaltzError):
    """A cluster-manager request is invalid in the current state (not started, not managed, bad partition)."""


@dataclass(frozen=True)
class ManagedServer:
    """A server process joining the cluster: its client endpoint and where its partitions go."""

    host: str
    port: int
    on_partitions: OnPartitions
    preferred_partitions: tuple[int, ...] = ()


class ClusterState(NamedTuple):
    """The last consistent view: assignment znode version, live servers (Java order) and assignment."""

    version: int
    members: tuple[ServerDescriptor, ...]
    assignment: PartitionAssignment

    def endpoints(self) -> dict[str, list[PartitionInfo]] | None:
        """Endpoint → its partitions; None when the assignment names a server that is not live."""
        by_id = {member.server_id: member for member in self.members}
        if any(server.server_id not in by_id for server in self.assignment.servers):
            return None
        return {by_id[s.server_id].endpoint: list(s.partitions) for s in self.assignment.servers}


class _Snapshot(NamedTuple):
    version: int
    cversion: int  # the serverDescriptors znode's child version, read atomically with `member_nodes`
    assignment: PartitionAssignment
    members: tuple[ServerDescriptor, ...]  # java.util.HashMap<Integer, …> order
    member_nodes: frozenset[str]
    forced: dict[int, int]
    forced_version: int

    @property
    def consistent(self) -> bool:
        return self.assignment.cversion == self.cversion

    def state(self) -> ClusterState:
        return ClusterState(self.version, self.members, self.assignment)


class _Registration(NamedTuple):
    server: ManagedServer
    descriptor: ServerDescriptor
    node_path: str


# --- forced assignments (blocking; usable from a CLI without any manager) ---------------------


def _read_forced(client: KazooClient, path: str, watch: Watch | None) -> tuple[dict[int, int], int] | None:
    """``(forced, znode version)``; None when the znode kept appearing and vanishing under us."""
    for _ in range(MAX_READ_ATTEMPTS):
        try:
            data, stat = client.get(path, watch=watch)
        except NoNodeError:
            if client.exists(path, watch=watch) is None:  # this watch fires when someone creates it
                return {}, ABSENT_VERSION
            continue
        try:
            forced = ForcedAssignments.from_bytes(data).as_dict() if data else {}
        except FormatError as e:
            logger.error("ignoring undecodable forced assignments at %s: %s", path, e)
            forced = {}
        return forced, stat.version
    return None


def read_forced_assignments(client: KazooClient, root: str) -> dict[int, int]:
    found = _read_forced(client, ClusterPaths.of(root).forced_assignments, None)
    if found is None:
        raise ConcurrentUpdateError("forced assignments kept changing while being read; retry")
    return found[0]


def _change_forced(
    client: KazooClient, root: str, change: Callable[[dict[int, int]], dict[int, int]]
) -> bool:
    """Compare-and-set ``change`` into the forced assignments; whether anything changed."""
    path = ClusterPaths.of(root).forced_assignments
    for _ in range(MAX_CAS_ATTEMPTS):
        found = _read_forced(client, path, None)
        if found is None:
            continue
        forced, version = found
        wanted = change(dict(forced))
        if wanted == forced:
            return False
        data = ForcedAssignments.of(wanted).to_bytes()
        try:
            if version == ABSENT_VERSION:
                client.create(path, data)
            else:
                client.set(path, data, version=version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
        return True
    raise ConcurrentUpdateError(
        f"forced assignments at {path} kept changing; gave up after {MAX_CAS_ATTEMPTS} tries"
    )


def _check_partition(partition_id: int, num_partitions: int) -> None:
    if not 0 <= partition_id < num_partitions:
        raise ClusterManagerError(f"partition {partition_id} is out of range [0, {num_partitions})")


def force_assign(client: KazooClient, root: str, partition_id: int, server_id: int) -> bool:
    """Pin ``partition_id`` to ``server_id`` while that server is alive, until :func:`force_unassign`."""
    _check_partition(partition_id, read_cluster_params(client, root).num_partitions)
    if server_id < FIRST_SERVER_ID:
        raise ClusterManagerError(f"server id {server_id} is invalid (server ids start at {FIRST_SERVER_ID})")
    return _change_forced(client, root, lambda forced: {**forced, partition_id: server_id})


def force_unassign(client: KazooClient, root: str, partition_id: int) -> bool:
    """Hand ``partition_id`` back to the policy; False when it was not forced."""
    return _change_forced(client, root, lambda forced: {p: s for p, s in forced.items() if p != partition_id})


# --- the watcher (client side) -----------------------------------------------------------------


class ClusterWatcher:
    """Follows the cluster and reports consistent states (the original's ``manage(ManagedClient)``)."""

    def __init__(
        self,
        client: KazooClient,
        root: str,
        *,
        on_endpoints: OnEndpoints | None = None,
        on_server_removed: OnServerRemoved | None = None,
    ) -> None:
        self._client = client
        self._paths = ClusterPaths.of(root)
        self._on_endpoints = on_endpoints
        self._on_server_removed = on_server_removed
        self._num_partitions = -1
        self._state: ClusterState | None = None
        self._state_changed = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()  # one refresh or membership change at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def root(self) -> str:
        return self._paths.root

    @property
    def num_partitions(self) -> int:
        assert self._num_partitions >= 0, "start() first"
        return self._num_partitions

    @property
    def state(self) -> ClusterState | None:
        return self._state

    async def start(self) -> None:
        assert self._task is None and not self._closed, "start() once"
        params = await asyncio.to_thread(read_cluster_params, self._client, self._paths.root)
        self._num_partitions = params.num_partitions
        self._loop = asyncio.get_running_loop()
        self._client.add_listener(self._on_connection_state)
        self._task = asyncio.create_task(self._run(), name=f"cluster-watch {self._paths.root}")
        self._wakeup.set()

    async def close(self) -> None:
        """Stop watching; re-raises what killed the task, if a bug did."""
        if self._closed:
            return
        self._closed = True
        self._client.remove_listener(self._on_connection_state)
        await cancel_and_wait(self._task)

    async def __aenter__(self) -> ClusterWatcher:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def wait_for_state(
        self, predicate: Callable[[ClusterState], bool], timeout_s: float
    ) -> ClusterState:
        """The first consistent state satisfying ``predicate``; ``TimeoutError`` after ``timeout_s``."""

        async def satisfied() -> ClusterState:
            while True:
                changed = self._state_changed
                if self._state is not None and predicate(self._state):
                    return self._state
                await changed.wait()

        async with asyncio.timeout(timeout_s):
            return await satisfied()

    async def forced_assign(self, partition_id: int, server_id: int) -> bool:
        return await asyncio.to_thread(force_assign, self._client, self._paths.root, partition_id, server_id)

    async def forced_unassign(self, partition_id: int) -> bool:
        return await asyncio.to_thread(force_unassign, self._client, self._paths.root, partition_id)

    # kazoo threads: only wake the task.

    def _on_watch_event(self, _event: Any) -> None:
        self._wake_from_kazoo()

    def _on_connection_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:  # watches or our ephemeral znode may be gone with a session
            self._wake_from_kazoo()

    def _wake_from_kazoo(self) -> None:
        loop = self._loop
        if self._closed or loop is None or loop.is_closed():
            return
        # The loop may close between the check and the call; then nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._wakeup.set)

    # the task

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            async with self._lock:
                try:
                    snapshot = await asyncio.to_thread(self._read_snapshot)
                    if snapshot is None:
                        self._wakeup.set()  # a znode moved under the read; read again
                    else:
                        await self._react(snapshot)
                except (KazooException, KazooTimeoutError, WaltzError) as e:
                    # Connection trouble ends in CONNECTED (which wakes us) or in a closed client.
                    logger.warning("cluster watch on %s: %s: %s", self._paths.root, type(e).__name__, e)

    def _read_snapshot(self) -> _Snapshot | None:
        client, paths, watch = self._client, self._paths, self._on_watch_event
        data, stat = client.get(paths.server_descriptors, watch=watch)
        children, children_stat = client.get_children(
            paths.server_descriptors, watch=watch, include_data=True
        )
        if children_stat.version != stat.version:
            return None
        try:
            assignment = PartitionAssignment.from_bytes(data)
        except FormatError as e:
            raise ClusterManagerError(
                f"{paths.server_descriptors} holds an undecodable assignment: {e}"
            ) from None
        by_id: dict[int, ServerDescriptor] = {}
        nodes = set()
        for name in sorted(children):  # creation order: the names are sequential
            path = f"{paths.server_descriptors}/{name}"
            if paths.kind_of(path) != "ServerDescriptor":
                continue
            try:
                raw, _ = client.get(path, watch=watch)
            except NoNodeError:
                continue  # the children watch reports the removal
            nodes.add(name)
            try:
                descriptor = ServerDescriptor.from_bytes(raw)
            except FormatError as e:
                logger.error("ignoring undecodable server descriptor %s: %s", path, e)
                continue
            by_id[descriptor.server_id] = descriptor
        forced = _read_forced(client, paths.forced_assignments, watch)
        if forced is None:
            return None
        members = tuple(by_id[s] for s in assignment_policy.in_java_order(by_id))
        return _Snapshot(stat.version, children_stat.cversion, assignment, members, frozenset(nodes), *forced)

    async def _react(self, snapshot: _Snapshot) -> None:
        if await self._coordinate(snapshot):
            return  # we wrote the znodes; their watches bring the next state
        if snapshot.consistent:
            self._deliver(snapshot)
        elif not snapshot.members:
            self._remove_all(snapshot)

    async def _coordinate(self, snapshot: _Snapshot) -> bool:
        """Whether a managed server changed the znodes in reaction to ``snapshot``."""
        return False

    def _deliver(self, snapshot: _Snapshot) -> None:
        old = self._state
        if (
            old is not None
            and old.version == snapshot.version
            and old.assignment.cversion == snapshot.cversion
        ):
            return  # the original skips these: only a descriptor's data moved
        state = snapshot.state()
        self._deliver_partitions(state)
        live = {member.server_id for member in state.members}
        for member in old.members if old is not None else ():
            if member.server_id not in live:
                self._call(self._on_server_removed, member.endpoint)
        endpoints = state.endpoints()
        if endpoints is None:
            logger.error("partition assignment in %s names servers that are not live", self._paths.root)
        else:
            self._call(self._on_endpoints, endpoints)
        self._publish(state)

    def _deliver_partitions(self, state: ClusterState) -> None:
        """Hook: a managed server learns its partitions first, as in the original."""

    def _remove_all(self, snapshot: _Snapshot) -> None:
        """No live server: clients drop them all; the stale assignment stays until one joins."""
        for member in self._state.members if self._state is not None else ():
            self._call(self._on_server_removed, member.endpoint)
        self._publish(ClusterState(snapshot.version, (), PartitionAssignment.initial()))

    def _publish(self, state: ClusterState) -> None:
        self._state = state
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    def _call(self, callback: Callable[[Any], None] | None, argument: Any) -> None:
        if callback is None:
            return
        try:
            callback(argument)
        except Exception:
            # A failing listener must not stop membership tracking for everyone else.
            logger.exception("cluster callback %r failed", callback)


# --- the manager (server side) -----------------------------------------------------------------


def _loop_rng() -> random.Random:
    try:
        rng = getattr(asyncio.get_running_loop(), "rng", None)
    except RuntimeError:
        rng = None
    return rng if isinstance(rng, random.Random) else random.Random()


class ClusterManager(ClusterWatcher):
    """A watcher that also manages one server: registers it, and coordinates when it has the lowest id."""

    def __init__(
        self,
        client: KazooClient,
        root: str,
        *,
        on_endpoints: OnEndpoints | None = None,
        on_server_removed: OnServerRemoved | None = None,
        rng: random.Random | None = None,
        is_local_host: Callable[[str], bool] = transport.is_local_host,
    ) -> None:
        super().__init__(client, root, on_endpoints=on_endpoints, on_server_removed=on_server_removed)
        # Whether a host is this machine's: the node's network answers (the simulator's from its
        # own host names), the operating system's by default.
        self._is_local_host = is_local_host
        # The shuffles' generator: the caller's, else the running loop's where it has one (the
        # simulator's, seeded: a simulated run stays a function of its seed), else a fresh one.
        self._rng = rng if rng is not None else _loop_rng()
        self._registration: _Registration | None = None
        self._forced_version_applied: int | None = None  # forced set this coordinator last honoured

    @property
    def server_id(self) -> int | None:
        return self._registration.descriptor.server_id if self._registration is not None else None

    async def manage(self, server: ManagedServer) -> int:
        """Join: a new server id from ``ids/server``, then an ephemeral sequential descriptor."""
        self._check_running()
        for partition_id in server.preferred_partitions:
            _check_partition(partition_id, self.num_partitions)
        async with self._lock:
            if self._registration is not None:
                raise ClusterManagerError("this manager already manages a server")
            server_id = await asyncio.to_thread(next_server_id, self._client, self._paths.root)
            descriptor = ServerDescriptor(
                server_id, server.host, server.port, tuple(server.preferred_partitions)
            )
            node_path = await asyncio.to_thread(self._create_node, descriptor)
            self._registration = _Registration(server, descriptor, node_path)
            await asyncio.to_thread(
                remove_stale_registrations,
                self._client,
                self._paths.root,
                descriptor,
                node_path,
                self._is_local_host,
            )
        return server_id

    async def unmanage(self) -> None:
        """Leave: delete the descriptor; the survivors' coordinator takes the partitions over."""
        async with self._lock:
            registration = self._registration
            if registration is None:
                raise ClusterManagerError("no managed server")
            self._registration = None
            self._forced_version_applied = None
            await asyncio.to_thread(self._delete_node, registration.node_path)

    async def set_preferred_partitions(self, partitions: tuple[int, ...]) -> None:
        """Re-publish the descriptor (set data, as the original) and force a new assignment."""
        self._check_running()
        for partition_id in partitions:
            _check_partition(partition_id, self.num_partitions)
        async with self._lock:
            registration = self._registration
            if registration is None:
                raise ClusterManagerError("no managed server")
            descriptor = registration.descriptor._replace(preferred_partitions=tuple(partitions))
            await asyncio.to_thread(self._client.set, registration.node_path, descriptor.to_bytes())
            self._registration = registration._replace(descriptor=descriptor)
            for _ in range(MAX_CAS_ATTEMPTS):
                snapshot = await asyncio.to_thread(self._read_snapshot)
                if snapshot is None:
                    continue
                if not snapshot.consistent or await self._write_assignment(snapshot):
                    return  # if inconsistent, the coordinator's recomputation reads our new descriptor
            raise ConcurrentUpdateError(
                "the partition assignment kept changing; preferred partitions not applied"
            )

    async def close(self) -> None:
        """Stop watching and leave the cluster (best effort: the kazoo client may be gone already)."""
        await super().close()
        registration, self._registration = self._registration, None
        if registration is not None:
            try:
                await asyncio.to_thread(self._delete_node, registration.node_path)
            except (KazooException, KazooTimeoutError) as e:
                logger.info("could not delete %s on close: %s", registration.node_path, type(e).__name__)

    def _check_running(self) -> None:
        if self._task is None or self._closed:
            raise ClusterManagerError("the cluster manager is not running")

    def _create_node(self, descriptor: ServerDescriptor) -> str:
        path: str = self._client.create(
            self._paths.server_descriptor_prefix, descriptor.to_bytes(), ephemeral=True, sequence=True
        )
        return path

    def _delete_node(self, path: str) -> None:
        with contextlib.suppress(NoNodeError):  # the session that held it ended already
            self._client.delete(path)

    async def _coordinate(self, snapshot: _Snapshot) -> bool:
        registration = self._registration
        if registration is None:
            return False
        if registration.node_path.rpartition("/")[2] not in snapshot.member_nodes:
            # Our ephemeral znode went with an expired session: re-create it with the same id.
            node_path = await asyncio.to_thread(self._create_node, registration.descriptor)
            self._registration = registration._replace(node_path=node_path)
            return True
        live = [member.server_id for member in snapshot.members]
        if not live or min(live) != registration.descriptor.server_id:
            self._forced_version_applied = None
            return False
        if snapshot.consistent and assignment_policy.honours_forced(
            snapshot.assignment, snapshot.forced, live
        ):
            if self._forced_version_applied is None:
                self._forced_version_applied = (
                    snapshot.forced_version
                )  # became coordinator of a settled cluster
            if self._forced_version_applied == snapshot.forced_version:
                return False
        await self._write_assignment(snapshot)
        return True

    async def _write_assignment(self, snapshot: _Snapshot) -> bool:
        """Compute and compare-and-set a new assignment; False when another writer won."""
        assignment = assignment_policy.update(
            self.num_partitions,
            snapshot.assignment,
            snapshot.members,
            snapshot.forced,
            self._rng,
            cversion=snapshot.cversion,
        )
        try:
            await asyncio.to_thread(
                self._client.set,
                self._paths.server_descriptors,
                assignment.to_bytes(),
                version=snapshot.version,
            )
        except BadVersionError:
            return False  # the cluster changed since the snapshot; its watch brings the next one
        self._forced_version_applied = snapshot.forced_version
        return True

    def _deliver_partitions(self, state: ClusterState) -> None:
        registration = self._registration
        if registration is not None:
            partitions = assignment_policy.partitions_of(state.assignment, registration.descriptor.server_id)
            self._call(registration.server.on_partitions, list(partitions))
