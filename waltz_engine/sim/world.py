"""A simulated cluster: real storage nodes, servers and clients as objects on one :class:`SimLoop`.

The nodes are the product's own (``StorageNode``, ``WaltzServer``, ``WaltzClient``), built with
the simulator's seams: each host's view of one :class:`SimNetwork`, the clients of one
:class:`SimZooKeeper`, and for each storage node its own :class:`SimDisk` (files in memory).

:func:`run_seed` starts a cluster, submits the workload's transactions from a client (``append``
or ``bank``, :mod:`waltz_engine.sim.workload`), waits until the client has applied every committed
one, and checks each outcome against the log (:func:`~waltz_engine.sim.workload.check_outcomes`)
and the replicas against the client's log (:func:`~waltz_engine.sim.replicas.check_replicas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.client import KazooClient

from waltz_engine.client.client import WaltzClient
from waltz_engine.client.config import WaltzClientConfig
from waltz_engine.common.config import Config
from waltz_engine.common.errors import WaltzError
from waltz_engine.server.config import ServerConfig
from waltz_engine.server.server import WaltzServer
from waltz_engine.sim import world_checks
from waltz_engine.sim.acknowledged import Acknowledged
from waltz_engine.sim.bank import Ledger
from waltz_engine.sim.disk import SimDisk
from waltz_engine.sim.disk_faults import DiskFaults
from waltz_engine.sim.faults import DEFAULT_FAULTS
from waltz_engine.sim.liveness import Liveness
from waltz_engine.sim.loop import START_MONOTONIC_S, SimDiskRunner, SimLoop
from waltz_engine.sim.network import SimNetwork
from waltz_engine.sim.object_store import SimBucket
from waltz_engine.sim.operator import Operator, operator_server_keys, operator_storage_keys
from waltz_engine.sim.seed import end_leftovers, quiet_logs, run_world, seed_heap
from waltz_engine.sim.storage_gone import StorageGone
from waltz_engine.sim.workload import (
    SERVER_FRAME_LIMIT_BYTES,
    Application,
    SimContext,
)
from waltz_engine.sim.world_acl import SIM_NODE_PRINCIPAL, acl_keys, grant
from waltz_engine.sim.world_constants import (
    CLIENT_HOST,
    CLUSTER_NAME,
    CLUSTER_ROOT,
    OPERATOR_HOST,
    ROGUE_HOST,
    SERVER_PORT,
    SESSION_TIMEOUT_MS,
    STORAGE_ADMIN_PORT,
    STORAGE_PORT,
    ZOOKEEPER_HOST,
)
from waltz_engine.sim.world_workload import SUBMIT_INTERVAL_S, WorkloadDriver, is_committed
from waltz_engine.sim.zk_model import SimZkClient, SimZooKeeper
from waltz_engine.storage.admin_client import StorageAdminClient
from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.storage.node.config import StorageConfig
from waltz_engine.storage.node.node import StorageNode
from waltz_engine.wire.frame import FRAME_HEADER_SIZE_BYTES
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.cluster_manager import force_assign, force_unassign
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.store_metadata import add_storage_node, assign_partitions

FORGED_SESSION_ID = 1 << 62  # a session id ZooKeeper never issues in a seed's time
DEFAULT_TRANSACTIONS = 100
MAX_TRANSACTIONS = 1_000_000
MAX_FAULTS = 100_000
# A node that failed to start (ZooKeeper out) is started again this much later.
RESTART_RETRY_S = 1.0
# A failing seed's report ends with this many events of its trace, in words.
LAST_EVENTS_SHOWN = 20
# Storage nodes roll segments at this size, so seeds have sealed segments as well as open ones.
SEGMENT_SIZE_THRESHOLD_BYTES = 64 * 1024
# A storage crash falls inside one of the node's next writes (between a write and its sync) with
# this probability, in one of its next MAX_WRITES_BEFORE_CRASH writes, if it writes within
# MID_WRITE_CRASH_WAIT_S; otherwise, and else, the power goes at once (wherever the node is).
MID_WRITE_CRASH_PROBABILITY = 0.5
MAX_WRITES_BEFORE_CRASH = 6
MID_WRITE_CRASH_WAIT_S = 3.0

_Node = TypeVar("_Node", StorageNode, WaltzServer, WaltzClient)
_R = TypeVar("_R")
# "append": numbered transactions, no locks; "bank": transfers under optimistic locks (sim/bank.py).
WORKLOADS = ("append", "bank")


@dataclass(frozen=True)
class WorldShape:
    storage_nodes: int = 3
    servers: int = 2
    partitions: int = 1
    transactions: int = DEFAULT_TRANSACTIONS
    # Network faults during the workload; with any, transactions are submitted one by one
    # SUBMIT_INTERVAL_S apart on average, so the faults fall among them.
    faults: int = DEFAULT_FAULTS
    workload: str = "append"  # one of WORKLOADS
    # The client's process restarts among the node faults (False: the world as it was before,
    # where the regression seeds found then replay).
    client_restarts: bool = True
    # ACLs on (issue 34): every connection carries its host's principal, the nodes enforce, and
    # the client may append to and read all but the last two partitions, only read the one
    # before last (its appends are refused) and neither on the last (its mounts are refused).
    acl: bool = False
    # Bit flips in the control file's partition structs too (off by default: a rotten current
    # struct rolls the partition back to the older one, as the original does, and its lost local
    # low-water mark can make later rot in a record cut synced records as a torn tail; see
    # docs/reliability.md).
    control_file_flips: bool = False
    # The operator's actions among the faults (waltz_engine.sim.operator), and the settings that
    # give them something to act on (False: the world as it was before them).
    operator_actions: bool = True
    # A storage node lost for good in some seeds (waltz_engine.sim.storage_gone: drawn from a
    # generator of the seed's own, so the others run as they did before it existed).
    storage_gone: bool = True
    # Transactions submitted at once, each SUBMIT_INTERVAL_S times this many apart on average
    # (the same rate): consecutive transactions go to consecutive partitions, so with several
    # partitions their appends reach a storage node together and its disk passes carry several
    # partitions' lone appends, made durable by one whole-disk sync (issue 33; 1: one by one, the
    # world as it was before).
    submits_together: int = 1


@dataclass
class SeedResult:
    seed: int
    transactions: int
    violations: list[str]
    trace_hash: str
    virtual_s: float
    cpu_s: float
    faults: dict[str, int] = field(default_factory=dict)
    last_events: list[str] = field(default_factory=list)
    refused: int = 0  # transactions that ended in their own application error on a retry
    # Transactions that ended otherwise, neither committed nor refused: declined (the bank), or
    # not committed or unknown when a client restart closed the client they went to.
    not_committed: int = 0


class SimWorld(DiskFaults, WorkloadDriver):
    """The hosts of one seed's cluster: ZooKeeper, storage nodes, servers and one client."""

    def __init__(self, loop: SimLoop, shape: WorldShape) -> None:
        self.loop = loop
        self.shape = shape
        self.network = SimNetwork(loop)
        self.zookeeper = SimZooKeeper(loop, trace=lambda event: loop.record("zookeeper", event))
        self.sync_latency_ms: dict[str, tuple[float, float] | None] = {}
        self.slow_syncs_until_s: dict[str, float] = {}
        self.disks: dict[str, SimDisk] = {}
        for number in range(shape.storage_nodes):
            self._disk(f"storage-{number}")
        self.settings = ZooKeeperSettings(ZOOKEEPER_HOST, CLUSTER_ROOT, SESSION_TIMEOUT_MS)
        self.storage: list[StorageNode] = []
        self.servers: list[WaltzServer] = []
        self.client: WaltzClient | None = None
        self.ledger = Ledger()
        self.payloads: dict[int, bytes] = {}  # each transaction's data as the client built it
        self.application = Application(
            self.ledger.apply if shape.workload == "bank" else None, payloads=self.payloads
        )
        # Machines whose power went (the world kills them), and one waiting for a mid-write death.
        self.dead: set[str] = set()
        self._dying: dict[str, asyncio.Event] = {}
        loop.on_crash = self._power_off
        # The one storage node whose media the world damages (bit flips) and what it damaged;
        # its control file is damaged once at most (one of a partition's two structs).
        self.damaged_host: str | None = None
        self.damage: list[str] = []
        self._control_damaged = False
        self.contexts: list[SimContext] = []
        self.incarnation = 0  # client restarts so far
        self._client_up = asyncio.Event()
        self.key = uuid.UUID(int=0)
        self.paused: set[int] = set()  # servers cut off by a pause or a crash
        self.forged_served: list[str] = []
        self.close_failures: list[str] = []
        self.bucket = SimBucket()  # the object store the storage nodes' tiers offload to
        self.operator = Operator(self)
        self.storage_port, self.storage_admin_port = STORAGE_PORT, STORAGE_ADMIN_PORT
        self.storage_down: set[int] = set()  # crashed, not restarted yet
        self.storage_crashes = 0
        self.gone: set[int] = set()  # storage nodes lost for good (storage_gone)
        self.storage_gone: StorageGone | None = None  # the seed's plan of that fault (run_world)
        self.liveness = Liveness(self)
        self.acknowledged = Acknowledged()  # checked against a storage node's disk at its restart

    def _zookeeper_keys(self) -> dict[str, Any]:
        return {
            "zookeeper.connectString": ZOOKEEPER_HOST,
            "zookeeper.sessionTimeout": SESSION_TIMEOUT_MS,
            "cluster.root": CLUSTER_ROOT,
        }

    def _create_cluster(self) -> uuid.UUID:
        partitions = list(range(self.shape.partitions))
        with connect(self.settings, self.zookeeper.connector()) as zk:
            key = uuid.UUID(int=self.loop.rng.getrandbits(128))
            params = create_cluster(zk, CLUSTER_ROOT, CLUSTER_NAME, self.shape.partitions, key)
            for number in range(self.shape.storage_nodes):
                storage = f"storage-{number}:{STORAGE_PORT}"
                add_storage_node(zk, CLUSTER_ROOT, storage, 0, STORAGE_ADMIN_PORT)
                assign_partitions(zk, CLUSTER_ROOT, storage, partitions)
            if self.shape.acl:
                grant(zk, CLUSTER_ROOT, self.shape, self.network.principals, [*self.disks])
        return params.key

    async def _assign_partitions(self, host: str, key: uuid.UUID) -> None:
        """What ``waltz storage add-partition`` tells a node, over its admin port."""
        admin = StorageAdminClient(
            host,
            STORAGE_ADMIN_PORT,
            None,
            key,
            self.shape.partitions,
            network=self.network.node(OPERATOR_HOST),
        )
        await admin.open()
        try:
            await admin.set_partition_assignment(list(range(self.shape.partitions)), True, False)
        finally:
            await admin.close()

    def _config(self, host: str, keys: dict[str, Any]) -> Config:
        return Config({**self._zookeeper_keys(), **keys}, host)

    async def _as_host(self, host: str, start: Callable[[], Coroutine[Any, Any, _R]]) -> _R:
        """Start a node as ``host``'s code: its tasks and callbacks die with its machine. A start
        that fails is a process that exits: what it opened (ports, ZooKeeper) goes with it."""
        try:
            return await self.loop.create_task(start(), context=self.loop.host_context(host))
        except (WaltzError, OSError):
            self._process_exits(host)
            raise

    def _process_exits(self, host: str) -> None:
        self.network.power_off(host)
        self.zookeeper.kill_host(host)
        self.loop.kill_host(host)

    def _disk(self, host: str) -> SimDisk:
        if host not in self.disks:
            self.disks[host] = SimDisk(sync_latency_ms=functools.partial(self._sync_latency_ms, host))
        return self.disks[host]

    def _sync_latency_ms(self, host: str) -> float:
        slow = self.sync_latency_ms.get(host)
        if slow is None:
            return 0.0
        # The pass's syncs run one after another: this one begins after those charged before it.
        begins_s = self.loop.time() + self.disks[host].pending_sync_delay_ms / 1000
        if begins_s >= self.slow_syncs_until_s.get(host, math.inf):
            return 0.0
        return self.loop.rng.uniform(*slow)

    def _seams(self, host: str) -> dict[str, Any]:
        """What a node of ``host`` is built with: its view of the network, the ZooKeeper model."""
        return {"network": self.network.node(host), "zk_connector": self.zookeeper.connector()}

    async def start(self) -> None:
        self.key = await asyncio.to_thread(self._create_cluster)
        for number in range(self.shape.storage_nodes):
            self.storage.append(await self._start_storage(number))
            await self._assign_partitions(f"storage-{number}", self.key)
        for number in range(self.shape.servers):
            self.servers.append(await self._start_server(number))
        await self._start_client()

    async def _start_client(self) -> None:
        config = WaltzClientConfig.from_config(self._zookeeper_keys())
        self.client = await _until_started(
            lambda: WaltzClient.create(self.application, config, **self._seams(CLIENT_HOST))
        )
        self._client_up.set()

    async def restart_client(self) -> None:
        """The application's process restarts: a new client resumes from its stored high-water mark."""
        self._client_up.clear()
        client, self.client = self.client, None
        self.incarnation += 1
        if client is not None:
            try:
                await client.close()
            except Exception as e:  # a client that cannot close cleanly is a finding
                self.close_failures.append(f"closing the client for a restart raised {e!r}")
        await self._start_client()

    async def _start_storage(self, number: int) -> StorageNode:
        host = f"storage-{number}"
        storage_keys = {
            "storage.host": host,
            "storage.port": STORAGE_PORT,
            "storage.admin.port": STORAGE_ADMIN_PORT,
            "storage.directory": f"/{host}",
            **acl_keys(self.shape.acl, "storage"),
            "storage.segment.size.threshold": SEGMENT_SIZE_THRESHOLD_BYTES,
            **operator_storage_keys(self.shape.operator_actions),  # (smaller segments with them)
        }
        storage_config = StorageConfig.from_config(self._config(host, storage_keys))
        disk = self._disk(host)  # (a node the operator added gets its disk at its first start)
        if self.shape.acl:
            self.network.principals.setdefault(host, SIM_NODE_PRINCIPAL)
        node = StorageNode(
            storage_config,
            **self._seams(host),
            disk=disk,
            disk_runner=functools.partial(SimDiskRunner, sync_delay_ms=disk.take_sync_delay_ms),
            tier_seam=self.bucket.seam(),
        )
        await self._as_host(host, node.start)
        return node

    async def _start_server(self, number: int) -> WaltzServer:
        host = f"server-{number}"
        server_keys = {
            "server.host": host,
            "server.advertisedHost": host,
            "server.port": SERVER_PORT,
            **acl_keys(self.shape.acl, "server"),
            "server.maxBufferedBytesPerConnection": SERVER_FRAME_LIMIT_BYTES + FRAME_HEADER_SIZE_BYTES,
            **operator_server_keys(self.shape.operator_actions),
        }
        server = WaltzServer(ServerConfig.from_config(self._config(host, server_keys)), **self._seams(host))
        await self._as_host(host, server.start)
        return server

    def heal(self) -> None:
        """Every fault ends: links whole, ZooKeeper reachable (nodes stop in a healthy world)."""
        for a, b in self.fault_pairs():
            self.network.thaw(a, b)
        for number in sorted(self.paused):
            self.resume_server(number)
        if self.zookeeper.in_outage:
            self.zookeeper.end_outage()
        for disk in self.disks.values():
            disk.capacity_bytes = None
            disk.failing_whole_syncs = 0
        self.sync_latency_ms.clear()
        self.slow_syncs_until_s.clear()
        self.bucket.heal()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        for server in self.servers:
            await server.stop()
        for number, node in enumerate(self.storage):
            if number not in self.gone:  # (its machine is gone: nothing of it runs)
                await node.stop()

    def fault_pairs(self) -> list[tuple[str, str]]:
        """The links faults hit: each server with each storage node, and the client with each server."""
        servers = [f"server-{n}" for n in range(self.shape.servers)]
        storage = [f"storage-{n}" for n in range(self.shape.storage_nodes)]
        return [(s, t) for s in servers for t in storage] + [(CLIENT_HOST, s) for s in servers]

    # --- node faults (waltz_engine.sim.node_faults) --------------------------------------------

    @property
    def num_servers(self) -> int:
        return self.shape.servers

    @property
    def num_storage_nodes(self) -> int:
        return self.shape.storage_nodes

    def servers_out(self) -> set[int]:
        """The servers out of service now: paused, frozen or crashed (not restarted yet)."""
        return {n for n in range(self.shape.servers) if n in self.paused or f"server-{n}" in self.dead}

    @property
    def num_partitions(self) -> int:
        return self.shape.partitions

    @property
    def client_restarts(self) -> bool:
        return self.shape.client_restarts

    @property
    def operator_actions(self) -> bool:
        return self.shape.operator_actions

    @property
    def whole_syncs(self) -> bool:
        return self.shape.partitions > 1 and self.shape.submits_together > 1

    def operate(self, kind: str, rng: Any, busy: set[str]) -> asyncio.Task[None] | None:
        return self.operator.inject(kind, rng, busy)

    async def add_storage_node(self, number: int) -> None:
        """A storage node beyond the shape's (the operator's ``add_storage``), started empty."""
        assert number == len(self.storage)
        self.storage.append(await _until_started(lambda: self._start_storage(number)))

    def _links_of(self, host: str) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.fault_pairs() if host in (a, b)]

    def _server_zookeeper(self, number: int) -> SimZkClient | None:
        zk = self.servers[number]._zk
        return zk if isinstance(zk, SimZkClient) else None

    def pause_server(self, number: int) -> None:
        """Nothing the server sends or is sent crosses; ZooKeeper stops hearing it."""
        self.paused.add(number)
        for a, b in self._links_of(f"server-{number}"):
            self.network.partition(a, b)
        zk = self._server_zookeeper(number)
        if zk is not None:
            self.zookeeper.isolate(zk)

    def resume_server(self, number: int) -> None:
        self.paused.discard(number)
        for a, b in self._links_of(f"server-{number}"):
            self.network.heal(a, b)
        zk = self._server_zookeeper(number)
        if zk is not None:
            self.zookeeper.heal(zk)

    def thaw_server(self, number: int) -> None:
        """A frozen server's links carry again (what it sent arrives); ZooKeeper still waits."""
        for a, b in self._links_of(f"server-{number}"):
            self.network.thaw(a, b)

    def expire_server_session(self, number: int) -> None:
        zk = self._server_zookeeper(number)
        if zk is not None and zk.client_id is not None:
            self.zookeeper.expire(zk.client_id[0])

    async def _change_forced(self, change: Callable[[KazooClient], object]) -> None:
        def run() -> None:
            with connect(self.settings, self.zookeeper.connector()) as zk:
                change(zk)

        with contextlib.suppress(WaltzError):  # ZooKeeper is out: the operator's call fails
            await asyncio.to_thread(run)

    async def force_assign(self, partition_id: int, number: int) -> None:
        server_id = self.servers[number].server_id
        if server_id is not None:
            await self._change_forced(lambda zk: force_assign(zk, CLUSTER_ROOT, partition_id, server_id))

    async def force_unassign(self, partition_id: int) -> None:
        await self._change_forced(lambda zk: force_unassign(zk, CLUSTER_ROOT, partition_id))

    def _power_off(self, host: str) -> None:
        """``host``'s machine loses power, now, in this turn: its disk keeps only what was synced
        (and a torn piece of its last write), its connections and listeners vanish without a
        word, its ZooKeeper session is left to expire, and none of its code runs again (its
        tasks are cancelled: what they run on the way out finds everything dead)."""
        if host in self.dead:
            return
        self.dead.add(host)
        rng = self.loop.rng
        disk = self.disks.get(host)
        if disk is not None:
            number = int(host.rsplit("-", 1)[1])
            self.acknowledged.note(host, self.storage[number] if number < len(self.storage) else None)
            disk.crash(keep_torn_bytes=rng.randrange(disk.torn_write_size_bytes() + 1))
        for a, b in self._links_of(host):
            self.network.partition(a, b)  # until it is back, nothing reaches it or answers
        self._process_exits(host)
        dying = self._dying.pop(host, None)
        if dying is not None:
            dying.set()

    async def crash_storage(self, number: int, mid_write: bool | None = None) -> None:
        """A power loss: at once, or inside one of the node's next writes (a torn write)."""
        host = f"storage-{number}"
        self.storage_down.add(number)  # (the operator's checks of a move need every node up)
        self.storage_crashes += 1
        rng = self.loop.rng
        if mid_write is None:
            mid_write = rng.random() < MID_WRITE_CRASH_PROBABILITY
        if mid_write:
            died = self._dying[host] = asyncio.Event()
            self.disks[host].crash_on_write(rng.randint(1, MAX_WRITES_BEFORE_CRASH))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MID_WRITE_CRASH_WAIT_S):
                    await died.wait()
        self._power_off(host)

    def lose_storage(self, number: int) -> None:
        """The machine and its disk are lost for good, now (storage_gone): nothing it would say
        crosses, its ZooKeeper session is left to expire, none of its code runs again, and it
        never restarts."""
        host = f"storage-{number}"
        self.loop.record("fault", f"storage_gone {host}")
        self.gone.add(number)
        self.dead.add(host)
        for a, b in self._links_of(host):
            self.network.partition(a, b)
        self._process_exits(host)

    async def restart_storage(self, number: int) -> None:
        host = f"storage-{number}"
        self._back_up(host)
        self.storage[number] = await _until_started(lambda: self._start_storage(number))
        self.acknowledged.check(host, self.storage[number], host == self.damaged_host)
        self.storage_down.discard(number)

    def _back_up(self, host: str) -> None:
        """The machine is back: its links heal (what peers still send to its old connections is
        answered with a reset)."""
        self.dead.discard(host)
        for a, b in self._links_of(host):
            self.network.heal(a, b)

    async def forge_reads(self) -> None:
        """A rogue client that knows the cluster key reads with a session id nobody issued."""
        for number in range(self.shape.storage_nodes):
            rogue = StorageClient(
                f"storage-{number}",
                STORAGE_PORT,
                None,
                self.key,
                self.shape.partitions,
                network=self.network.node(ROGUE_HOST),
            )
            try:
                await rogue.open()
                for partition_id in range(self.shape.partitions):
                    with contextlib.suppress(StorageRpcError):  # refused: as it must be
                        await rogue.max_transaction_id(FORGED_SESSION_ID, partition_id)
                        self.forged_served.append(
                            f"storage-{number} served a read of partition {partition_id} with the "
                            f"forged session id {FORGED_SESSION_ID}"
                        )
            except (OSError, TimeoutError, WaltzError):
                pass  # the node is down or cut off
            finally:
                await rogue.close()

    async def crash_server(self, number: int) -> None:
        self._power_off(f"server-{number}")

    async def restart_server(self, number: int) -> None:
        self._back_up(f"server-{number}")
        self.servers[number] = await _until_started(lambda: self._start_server(number))

    def owner_of(self, partition_id: int) -> int | None:
        """The server that has ``partition_id`` mounted now, if one has."""
        for number, server in enumerate(self.servers):
            core = server.core
            if number not in self.paused and core is not None and partition_id in core.partitions:
                return number
        return None

    def freeze_server(self, number: int) -> None:
        """The server's links to the storage nodes stall (a stalled switch, a frozen storage
        network), and no connection gives up on them; ZooKeeper stops hearing it too. It goes on
        taking its clients' appends and sending them on; when the freeze outlasts its session,
        its partitions move to another server, and what it sent arrives after, at storage nodes
        a newer store session has fenced."""
        self.paused.add(number)
        server = f"server-{number}"
        for a, b in self._links_of(server):
            if a != CLIENT_HOST:
                self.network.freeze(a, b)
        zk = self._server_zookeeper(number)
        if zk is not None:
            self.zookeeper.isolate(zk)

    def check(self) -> list[str]:
        return world_checks.check(self)

    def check_replicas(self) -> list[str]:
        return world_checks.check_replicas(self)

    async def export_read(self) -> list[str]:
        return await world_checks.export_read(self)


async def _until_started(start: Callable[[], Awaitable[_Node]]) -> _Node:
    """A supervisor restarts a node until it starts (it cannot while ZooKeeper is out, nor while
    its disk is full)."""
    while True:
        try:
            return await start()
        except (WaltzError, OSError):
            await asyncio.sleep(RESTART_RETRY_S)


def run_seed(seed: int, shape: WorldShape | None = None) -> SeedResult:
    """One seed: a cluster started, the workload appended and checked, the cluster stopped."""
    shape = shape or WorldShape()
    started_s = time.process_time()
    with seed_heap(), quiet_logs():
        loop = SimLoop(seed)
        world = SimWorld(loop, shape)
        injected: dict[str, int] = {}

        asyncio.set_event_loop(loop)
        try:
            span_s = shape.transactions * SUBMIT_INTERVAL_S
            violations = loop.run_until_complete(run_world(world, span_s, injected))
            trace_hash, virtual_s = loop.trace_hash, loop.time() - START_MONOTONIC_S
        finally:
            end_leftovers(loop)
            asyncio.set_event_loop(None)
            loop.close()
    return SeedResult(
        seed,
        world.application.count(),
        violations,
        trace_hash,
        virtual_s,
        time.process_time() - started_s,
        injected,
        [str(event) for event in loop.tail][-LAST_EVENTS_SHOWN:] if violations else [],
        sum(1 for context in world.contexts if context.refused),
        sum(1 for context in world.contexts if not (context.refused or is_committed(context))),
    )
