"""A local cluster: ZooKeeper, storage nodes and servers brought up, checked and taken down
together, with its state kept in the cluster directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from kazoo.client import KazooClient

from waltz_engine.common.address import is_port
from waltz_engine.common.errors import WaltzError
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.ops.cluster_ops import read_cluster_view, verify
from waltz_engine.ops.devcluster.nodes import (
    ADMIN_TIMEOUT_MS,
    CLIENT_CONFIG_FILE_NAME,
    DEFAULT_CLUSTER_NAME,
    DEFAULT_CLUSTER_ROOT,
    DEFAULT_PARTITIONS,
    DEFAULT_SERVERS,
    DEFAULT_STORAGES,
    DEFAULT_WAIT_TIMEOUT_MS,
    HOST,
    PORT_WORDS,
    PORTS_PER_SERVER,
    PORTS_PER_STORAGE,
    SERVER,
    SERVER_STORAGE_INITIAL_RETRY_MS,
    SERVER_STORAGE_MAX_RETRY_MS,
    STATE_FILE_NAME,
    STATE_VERSION,
    STORAGE,
    STORAGE_GROUP,
    VERIFY_RETRY_INTERVAL_S,
    VERIFY_RPC_TIMEOUT_S,
    ZK_CONNECT_TIMEOUT_MS,
    ZK_SESSION_TIMEOUT_MS,
    ZOOKEEPER_DIR_NAME,
    DevClusterError,
    LocalNode,
    NodeLauncher,
    NodeStatus,
    accepts_connections,
    free_port,
    launch_node_process,
    port_taken,
)
from waltz_engine.ops.devcluster.settings import SERVER_NODE, STORAGE_NODE, partitions_of, settings_for
from waltz_engine.storage.admin_ops import add_partitions, client_ssl_context, read_store_layout
from waltz_engine.zk import store_metadata
from waltz_engine.zk.cluster import create_cluster, delete_cluster, read_cluster_params
from waltz_engine.zk.connection import ZooKeeperSettings, connect
from waltz_engine.zk.server import EmbeddedZooKeeper


class ClusterStatus(NamedTuple):
    directory: str
    cluster_root: str
    zookeeper: str
    zookeeper_running: bool
    client_config: str
    nodes: list[NodeStatus]

    @property
    def healthy(self) -> bool:
        return self.zookeeper_running and all(n.healthy for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "cluster_root": self.cluster_root,
            "zookeeper": {"connect_string": self.zookeeper, "running": self.zookeeper_running},
            "client_config": self.client_config,
            "healthy": self.healthy,
            "nodes": [n.to_json() for n in self.nodes],
        }


# Random picks may repeat; this many per port needed before giving up.
PORT_PICKS_PER_PORT = 10


def _allocate_ports(base_port: int | None, count: int) -> Iterator[int]:
    if base_port is None:
        ports: list[int] = []
        for _ in range(count * PORT_PICKS_PER_PORT):
            port = free_port()
            if port not in ports:  # picked at random: the same one twice is possible
                ports.append(port)
            if len(ports) == count:
                yield from ports
                return
        raise DevClusterError(f"found {len(ports)} free ports of the {count} needed; pass --base-port")
    if not (is_port(base_port) and is_port(base_port + count - 1)):
        raise DevClusterError(f"ports {base_port}..{base_port + count - 1} are not all valid ports")
    yield from range(base_port, base_port + count)


class LocalCluster:
    """ZooKeeper, ``storages`` storage nodes (group 0; each partition on ``replicas`` of them,
    default all) and ``servers`` servers, all under ``directory``.

    ``settings``: extra keys for the YAML of the nodes that read them (saved with the cluster;
    ``None`` keeps the saved ones). ``zookeeper`` given: use that ZooKeeper (e.g. a test
    session's) instead of starting one.
    ``base_port`` given: ZooKeeper on it, then 3 ports per storage node and 2 per server;
    otherwise free ports. On a directory that already holds a cluster the saved topology and
    ports win (a mismatch with what was asked is an error). ``launcher`` starts each node process.
    """

    def __init__(
        self,
        directory: Path | str,
        storages: int = DEFAULT_STORAGES,
        servers: int = DEFAULT_SERVERS,
        partitions: int = DEFAULT_PARTITIONS,
        base_port: int | None = None,
        *,
        zookeeper: str | None = None,
        cluster_root: str = DEFAULT_CLUSTER_ROOT,
        storage_config: dict[str, Any] | None = None,
        server_config: dict[str, Any] | None = None,
        replicas: int | None = None,
        settings: Mapping[str, Any] | None = None,
        launcher: NodeLauncher = launch_node_process,
    ) -> None:
        if storages < 1 or servers < 0 or partitions < 1:
            raise DevClusterError("a cluster needs at least 1 storage node and 1 partition, and 0+ servers")
        if replicas is not None and not 1 <= replicas <= storages:
            raise DevClusterError(f"--replicas must be in 1..{storages} (the storage nodes), got {replicas}")
        self.directory = Path(directory).resolve()
        self.launcher = launcher
        self.num_partitions = partitions
        self.replicas = replicas if replicas is not None else storages
        self.settings = dict(settings or {})
        self.cluster_root = cluster_root
        self.external_zookeeper = zookeeper
        # Extra keys for every storage node's YAML (e.g. a small segment size in tests); not saved.
        self.storage_config = dict(storage_config or {})
        # Defaults for every server's YAML that --set keys override (`dev up`'s grace); not saved.
        self.server_config = dict(server_config or {})
        # Whether the directory is ours to remove on down(clean=True) (saved in the state).
        self.created_directory = not self.directory.exists()
        saved = self._load_state()
        if saved is not None:
            self._restore(saved, storages, servers, partitions, replicas, settings)
            return
        ports = _allocate_ports(base_port, 1 + PORTS_PER_STORAGE * storages + PORTS_PER_SERVER * servers)
        zk_port = next(ports)
        self.zookeeper_port = zk_port if zookeeper is None else None
        self.storages = [
            self._node(
                STORAGE, i, {"port": next(ports), "admin_port": next(ports), "jetty_port": next(ports)}
            )
            for i in range(storages)
        ]
        self.servers = [
            self._node(SERVER, j, {"port": next(ports), "jetty_port": next(ports)}) for j in range(servers)
        ]

    @classmethod
    def open(cls, directory: Path | str) -> LocalCluster:
        """The cluster saved in ``directory`` (for status/down from another process)."""
        state_path = Path(directory) / STATE_FILE_NAME
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DevClusterError(
                f"no local cluster in {Path(directory).resolve()} (no {STATE_FILE_NAME})"
            ) from None
        except (OSError, ValueError) as e:
            raise DevClusterError(f"cannot read {state_path}: {e}") from None
        return cls(
            directory,
            len(state["storages"]),
            len(state["servers"]),
            state["partitions"],
            zookeeper=state.get("external_zookeeper"),
            cluster_root=state["cluster_root"],
            replicas=state.get("replicas"),
        )

    @staticmethod
    def exists(directory: Path | str) -> bool:
        return (Path(directory) / STATE_FILE_NAME).is_file()

    # --- state ---------------------------------------------------------------------------

    def _node(self, kind: str, index: int, ports: dict[str, int], pid: int | None = None) -> LocalNode:
        return LocalNode(kind, index, self.directory, ports, pid, self._save_state, self.launcher)

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE_NAME

    @property
    def _temporary_state_path(self) -> Path:
        return self.state_path.with_suffix(".tmp")

    @property
    def client_config_path(self) -> Path:
        return self.directory / CLIENT_CONFIG_FILE_NAME

    @property
    def nodes(self) -> list[LocalNode]:
        return [*self.storages, *self.servers]

    def _load_state(self) -> dict[str, Any] | None:
        if self.directory.exists() and not self.directory.is_dir():
            raise DevClusterError(f"{self.directory} is not a directory: give a new or empty one")
        try:
            state: dict[str, Any] = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise DevClusterError(f"cannot read {self.state_path}: {e}") from None
        if state.get("version") != STATE_VERSION:
            raise DevClusterError(f"{self.state_path}: unknown state version {state.get('version')}")
        return state

    def _restore(
        self,
        state: dict[str, Any],
        storages: int,
        servers: int,
        partitions: int,
        replicas: int | None,
        settings: Mapping[str, Any] | None,
    ) -> None:
        found = (len(state["storages"]), len(state["servers"]), state["partitions"])
        found_replicas = state.get("replicas", found[0])  # saved before --replicas: every node
        if found != (storages, servers, partitions) or found_replicas != self.replicas:
            raise DevClusterError(
                f"{self.directory} holds a cluster of {found[0]} storage nodes, {found[1]} servers and "
                f"{found[2]} partitions on {found_replicas} replicas each, not "
                f"{storages}/{servers}/{partitions} on {self.replicas}; "
                "use it as it is or remove it (down --clean)"
            )
        self.cluster_root = state["cluster_root"]
        self.created_directory = bool(state.get("created_directory", False))
        self.external_zookeeper = state.get("external_zookeeper")
        self.zookeeper_port = state.get("zookeeper_port")
        self.storages = [
            self._node(STORAGE, i, n["ports"], n.get("pid")) for i, n in enumerate(state["storages"])
        ]
        self.servers = [
            self._node(SERVER, j, n["ports"], n.get("pid")) for j, n in enumerate(state["servers"])
        ]
        saved_settings = state.get("settings", {})
        if settings is not None and dict(settings) != saved_settings:
            running = [node.name for node in self.nodes if node.is_running()]
            if running:
                raise DevClusterError(
                    f"{', '.join(running)} run with the saved --set keys {saved_settings}: stop the "
                    "cluster (`waltz dev down`) before changing them"
                )
        self.settings = dict(saved_settings if settings is None else settings)

    def _save_state(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {
            "version": STATE_VERSION,
            "cluster_root": self.cluster_root,
            "partitions": self.num_partitions,
            "replicas": self.replicas,
            "settings": self.settings,
            "zookeeper_port": self.zookeeper_port,
            "external_zookeeper": self.external_zookeeper,
            "created_directory": self.created_directory,
            "storages": [{"ports": n.ports, "pid": n.pid} for n in self.storages],
            "servers": [{"ports": n.ports, "pid": n.pid} for n in self.servers],
        }
        temporary = self._temporary_state_path
        temporary.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        temporary.replace(self.state_path)  # atomic: a concurrent `status` never reads half a file

    # --- ZooKeeper -----------------------------------------------------------------------

    @property
    def embedded_zookeeper(self) -> EmbeddedZooKeeper | None:
        if self.external_zookeeper is not None:
            return None
        return EmbeddedZooKeeper(self.directory / ZOOKEEPER_DIR_NAME, self.zookeeper_port, HOST)

    @property
    def zookeeper(self) -> str:
        """The ZooKeeper connect string."""
        if self.external_zookeeper is not None:
            return self.external_zookeeper
        return f"{HOST}:{self.zookeeper_port}"

    def zookeeper_settings(self) -> ZooKeeperSettings:
        return ZooKeeperSettings(
            self.zookeeper, self.cluster_root, ZK_SESSION_TIMEOUT_MS, ZK_CONNECT_TIMEOUT_MS
        )

    def _zookeeper_running(self) -> bool:
        embedded = self.embedded_zookeeper
        if embedded is not None:
            return embedded.is_serving()
        return any(accepts_connections(host) for host in self.zookeeper.partition("/")[0].split(","))

    # --- up ------------------------------------------------------------------------------

    def up(self, wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS) -> None:
        """Start whatever is not running and return once ``cluster verify`` passes.

        Refuses a non-empty directory that holds no cluster, and a port another process holds;
        when it fails half way it stops every process it started (and keeps the files).
        """
        assert wait_timeout_ms > 0
        deadline = time.monotonic() + wait_timeout_ms / 1000
        self._claim_directory()
        self._save_state()
        self._check_ports_free()
        started: list[LocalNode] = []
        embedded = self.embedded_zookeeper
        # Ours to stop on failure once it runs, even when a Ctrl-C comes while it starts.
        zookeeper_started = embedded is not None and not embedded.is_running()
        try:
            if embedded is not None and zookeeper_started:
                embedded.start(wait_timeout_ms)
            # `ruok` answers as soon as ZooKeeper's process listens; its first session can take
            # longer on a loaded machine (the transaction log's first preallocation and fsync),
            # so the connect may use what is left of up's own bound, not a shorter one.
            remaining_ms = max(ZK_CONNECT_TIMEOUT_MS, int((deadline - time.monotonic()) * 1000))
            with connect(self.zookeeper_settings()._replace(connect_timeout_ms=remaining_ms)) as zk:
                self._ensure_metadata(zk)
                self._write_node_configs()
                self._start_all(self.storages, deadline, started)
                asyncio.run(self._assign_on_nodes(zk))
                self._start_all(self.servers, deadline, started)
                self._write_client_config()
                if self.servers:
                    self.wait_verified(zk, deadline)
        except BaseException:
            self._stop_started(started, embedded if zookeeper_started else None)
            raise

    def _claim_directory(self) -> None:
        """Our directory: one that holds this cluster, or a new or empty one (else refused)."""
        if self.state_path.is_file():
            return
        if self.directory.exists():
            if not self.directory.is_dir():
                raise DevClusterError(f"{self.directory} is not a directory: give a new or empty one")
            if any(self.directory.iterdir()):
                raise DevClusterError(
                    f"{self.directory} is not empty and holds no local cluster (no {STATE_FILE_NAME}): "
                    "give a new or empty directory"
                )
        else:
            self.created_directory = True
        self.directory.mkdir(parents=True, exist_ok=True)

    def _check_ports_free(self) -> None:
        """Every port of what is not running yet is free (one line naming the port if not)."""
        wanted: list[tuple[int, str]] = []
        embedded = self.embedded_zookeeper
        if embedded is not None and not embedded.is_running():
            wanted.append((embedded.port, "ZooKeeper's client port"))
        for node in self.nodes:
            if not node.is_running():
                words = PORT_WORDS[node.kind]
                wanted += [
                    (port, f"{node.name} {words.get(key, key.replace('_', ' '))}")
                    for key, port in self.process_ports(node).items()
                ]
        for port, use in wanted:
            if port_taken(port):
                raise DevClusterError(
                    f"port {port} ({use}) is in use by another process: stop that process, "
                    "or start the cluster in another directory (other ports)"
                )

    def process_ports(self, node: LocalNode) -> dict[str, int]:
        """The ports ``node``'s own process binds (a subclass may put a proxy on one of them)."""
        return dict(node.ports)

    def _stop_started(self, started: list[LocalNode], zookeeper: EmbeddedZooKeeper | None) -> None:
        """After a failed ``up``: stop what it started, servers first, ZooKeeper last."""
        for node in sorted(started, key=lambda n: n.kind == STORAGE):  # servers, then storage nodes
            with contextlib.suppress(WaltzError):
                node.stop()
        if zookeeper is not None:
            with contextlib.suppress(WaltzError):
                zookeeper.stop()

    def _start_all(self, nodes: list[LocalNode], deadline: float, started: list[LocalNode]) -> None:
        # Launched together, then awaited: each node takes about a second to import and bind.
        launched = []
        for node in nodes:
            if not node.is_running():
                launched.append((node, node.launch()))
                started.append(node)
        for node, log_offset in launched:
            node.await_ready(log_offset, self._remaining_ms(deadline))

    @staticmethod
    def _remaining_ms(deadline: float) -> int:
        remaining = int((deadline - time.monotonic()) * 1000)
        if remaining <= 0:
            raise DevClusterError("the local cluster did not come up in time")
        return remaining

    def _ensure_metadata(self, zk: KazooClient) -> None:
        """What test-cluster.sh does with ZooKeeperCli: create, add-storage-node -g 0, assign-partition."""
        if zk.exists(self.cluster_root) is None:
            create_cluster(zk, self.cluster_root, DEFAULT_CLUSTER_NAME, self.num_partitions)
        found = read_cluster_params(zk, self.cluster_root).num_partitions
        if found != self.num_partitions:
            raise DevClusterError(
                f"the cluster at {self.cluster_root} has {found} partitions, not {self.num_partitions}"
            )
        for node in self.storages:
            assigned = store_metadata.read_replica_assignments(zk, self.cluster_root).as_dict()
            if node.connect_string in assigned:
                continue  # its replicas may have moved since (decommission, re-replication)
            store_metadata.add_storage_node(
                zk, self.cluster_root, node.connect_string, STORAGE_GROUP, node.admin_port
            )
            partitions = self.partitions_of(node)
            if partitions:
                store_metadata.assign_partitions(zk, self.cluster_root, node.connect_string, partitions)

    def partitions_of(self, node: LocalNode) -> list[int]:
        """The partitions ``node`` (a storage node) holds a replica of."""
        return partitions_of(node.index, len(self.storages), self.replicas, self.num_partitions)

    def _common_config(self) -> dict[str, Any]:
        return {
            "zookeeper.connectString": self.zookeeper,
            "zookeeper.sessionTimeout": ZK_SESSION_TIMEOUT_MS,
            "cluster.root": self.cluster_root,
        }

    def _write_node_configs(self) -> None:
        for node in self.storages:
            config = {
                **self._common_config(),
                "storage.host": HOST,
                "storage.port": node.port,
                "storage.admin.port": node.admin_port,
                "storage.jetty.port": node.jetty_port,
                "storage.directory": str(node.data_directory),
                **settings_for(STORAGE_NODE, self.settings),
                **self.storage_config,
            }
            self._write_yaml(node.config_path, config)
        for node in self.servers:
            config = {
                **self._common_config(),
                "server.host": HOST,
                "server.advertisedHost": HOST,
                "server.port": node.port,
                "server.jetty.port": node.jetty_port,
                "storage.initialRetryInterval": SERVER_STORAGE_INITIAL_RETRY_MS,
                "storage.maxRetryInterval": SERVER_STORAGE_MAX_RETRY_MS,
                **self.server_config,
                **settings_for(SERVER_NODE, self.settings),
            }
            self._write_yaml(node.config_path, config)

    def _write_client_config(self) -> None:
        self._write_yaml(self.client_config_path, {**self._common_config(), "client.autoMount": True})

    @staticmethod
    def _write_yaml(path: Path, config: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    async def _assign_on_nodes(self, zk: KazooClient) -> None:
        """``StorageCli add-partition`` on every node (a no-op for partitions it already has), as
        ZooKeeper assigns them now: replicas moved since the cluster was made stay moved."""
        layout = read_store_layout(zk, self.cluster_root)
        context = layout.context(client_ssl_context(None), ADMIN_TIMEOUT_MS)
        for node in self.storages:
            partitions = layout.assignments.get(node.connect_string, ())
            if partitions:
                await add_partitions(context, layout.admin_address(node.connect_string), partitions)

    def wait_verified(self, zk: KazooClient | None = None, deadline: float | None = None) -> None:
        """Until every one of ``cluster verify``'s validations passes (bounded)."""
        if zk is None:
            with connect(self.zookeeper_settings()) as client:
                self.wait_verified(client, deadline)
            return
        deadline = deadline if deadline is not None else time.monotonic() + DEFAULT_WAIT_TIMEOUT_MS / 1000
        ssl_context = client_context(TlsConfig())
        while True:
            report = asyncio.run(
                verify(read_cluster_view(zk, self.cluster_root), ssl_context, VERIFY_RPC_TIMEOUT_S)
            )
            if report.passed:
                return
            if time.monotonic() > deadline:
                failures = [line for line in report.original_text() if "error" in line.lower()]
                raise DevClusterError(
                    "cluster verify did not pass in time: " + (failures[0].strip() if failures else "failed")
                )
            time.sleep(VERIFY_RETRY_INTERVAL_S)

    # --- status / down -------------------------------------------------------------------

    def _adopt_saved_pids(self) -> None:
        """Take the pids from the state file: whoever last started a node wrote its pid there."""
        state = self._load_state()
        if state is None:
            return
        for node, saved in zip(self.nodes, [*state["storages"], *state["servers"]], strict=True):
            node.pid = saved.get("pid")

    def status(self) -> ClusterStatus:
        self._adopt_saved_pids()
        return ClusterStatus(
            str(self.directory),
            self.cluster_root,
            self.zookeeper,
            self._zookeeper_running(),
            str(self.client_config_path),
            [node.status() for node in self.nodes],
        )

    def is_running(self) -> bool:
        """Whether any node (or the embedded ZooKeeper) runs."""
        embedded = self.embedded_zookeeper
        return any(n.is_running() for n in self.nodes) or (embedded is not None and embedded.is_running())

    def down(self, clean: bool = False) -> None:
        """SIGTERM servers, then storage nodes, then ZooKeeper; ``clean`` also deletes what ``up``
        made (the data, logs and configs; nothing else in the directory)."""
        self._adopt_saved_pids()
        for node in [*self.servers, *self.storages]:
            node.stop()
        embedded = self.embedded_zookeeper
        if embedded is not None:
            embedded.stop()
        if not clean:
            return
        if self.external_zookeeper is not None:
            with contextlib.suppress(WaltzError), connect(self.zookeeper_settings()) as zk:
                if zk.exists(self.cluster_root) is not None:
                    delete_cluster(zk, self.cluster_root, DEFAULT_CLUSTER_NAME, force=True)
        self._remove_own_files()

    def own_paths(self) -> list[Path]:
        """What ``up`` makes in the directory; the state file last (a cut clean can be redone)."""
        names = [node.name for node in self.nodes]
        if self.external_zookeeper is None:
            names.append(ZOOKEEPER_DIR_NAME)
        paths = [self.directory / name for name in names]
        return [*paths, self.client_config_path, self._temporary_state_path, self.state_path]

    def _remove_own_files(self) -> None:
        for path in self.own_paths():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if self.created_directory:
            with contextlib.suppress(OSError):  # not empty: someone else's files stay, and it with them
                self.directory.rmdir()

    def stop(self) -> None:
        """:meth:`down` keeping the data (the name tests use for other nodes too)."""
        self.down()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
