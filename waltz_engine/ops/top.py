"""`waltz top`: a live view of a cluster from ZooKeeper and the nodes' ``/metrics`` and
``/health`` (reference §1.8, §2.2, §2.9).

ZooKeeper gives the servers, the partition assignment with generations and each partition's
store session and replica states; a server's metrics give its partitions' high-water marks
and append meters; a storage node's metrics give each replica's max transaction id (its lag is
the partition's high-water mark minus that). HTTP ports are not in ZooKeeper: they come from
``--http host:port`` options or, for a dev cluster, from the devcluster.json beside the client
config. Rates are per second over the last interval (the first snapshot uses the 1-minute rate).
"""

from __future__ import annotations

import contextlib
import json
import select
import sys
import termios
import time
import tty
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from waltz_engine.common.config import resolve_config_path
from waltz_engine.ops.cluster_ops import read_cluster_view
from waltz_engine.ops.devcluster import HOST, STATE_FILE_NAME
from waltz_engine.zk.connection import ZooKeeperSettings, connect

HTTP_TIMEOUT_S = 2.0
HTTP_OK = 200
SERVER_PREFIX = "waltz-server."
STORAGE_PREFIX = "waltz-storage."
NO_VALUE = -1
MS_PER_S = 1000


def dev_cluster_http(
    client_config: Path | None, kinds: tuple[str, ...] = ("servers", "storages")
) -> dict[str, str]:
    """The HTTP addresses of a dev cluster's nodes of ``kinds``, each with the node's name as
    the cluster knows it (its data or client address, HOST:PORT), when ``client_config`` is one's
    client.yml (None: the config a command falls back to, the local dev cluster's when there is one)."""
    client_config = resolve_config_path(client_config)
    if client_config is None:
        return {}
    state_path = client_config.resolve().parent / STATE_FILE_NAME
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {
        f"{HOST}:{n['ports']['jetty_port']}": f"{HOST}:{n['ports']['port']}"
        for kind in kinds
        for n in state.get(kind, [])
    }


def _get(url: str) -> tuple[int, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310 (http only)
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, None
    except (OSError, ValueError):
        return None


@dataclass
class NodeMetrics:
    """One node's /metrics and /health; ``reachable`` False when it did not answer."""

    http: str
    reachable: bool = False
    healthy: bool = False
    gauges: dict[str, Any] = field(default_factory=dict)
    meters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fetch(cls, http: str) -> NodeMetrics:
        node = cls(http)
        metrics = _get(f"http://{http}/metrics")
        if metrics is None or not isinstance(metrics[1], dict):
            return node
        node.reachable = True
        node.gauges = {k: v.get("value") for k, v in metrics[1].get("gauges", {}).items()}
        node.meters = metrics[1].get("meters", {})
        health = _get(f"http://{http}/health")
        node.healthy = health is not None and health[0] == HTTP_OK
        return node

    @property
    def is_server(self) -> bool:
        return any(k.startswith(SERVER_PREFIX) for k in self.gauges)

    def gauge(self, name: str, default: Any = NO_VALUE) -> Any:
        value = self.gauges.get(name)
        return default if value is None else value

    def count(self, name: str) -> int:
        return int(self.meters.get(name, {}).get("count", 0))

    def m1_rate(self, name: str) -> float:
        return float(self.meters.get(name, {}).get("m1_rate", 0.0))


def _rate(now: NodeMetrics, before: NodeMetrics | None, meter: str, interval_s: float) -> float:
    if before is None or not before.reachable or interval_s <= 0:
        return now.m1_rate(meter)
    return max(0, now.count(meter) - before.count(meter)) / interval_s


@dataclass
class Snapshot:
    taken_at: float  # time.monotonic(): rates are over the interval between two snapshots
    cluster: dict[str, Any]
    servers: list[dict[str, Any]]
    storages: list[dict[str, Any]]
    partitions: list[dict[str, Any]]
    nodes: dict[str, NodeMetrics] = field(default_factory=dict, repr=False)
    wall_time_s: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at_ms": int(self.wall_time_s * MS_PER_S),
            "cluster": self.cluster,
            "servers": self.servers,
            "storages": self.storages,
            "partitions": self.partitions,
        }


def take_snapshot(
    settings: ZooKeeperSettings, http: Mapping[str, str], previous: Snapshot | None = None
) -> Snapshot:
    """One look at the cluster; ``http`` maps each node's HTTP address to its name (HOST:PORT of
    its data port for a storage node), the name the tables show."""
    now = time.monotonic()
    interval_s = now - previous.taken_at if previous is not None else 0.0
    with connect(settings) as zk:
        view = read_cluster_view(zk, settings.cluster_root)
    nodes = {address: NodeMetrics.fetch(address) for address in http}
    before = previous.nodes if previous is not None else {}
    by_server_id = {int(n.gauge(f"{SERVER_PREFIX}server-id")): n for n in nodes.values() if n.is_server}
    storage_nodes = [n for n in nodes.values() if n.reachable and not n.is_server]
    generations = {
        p.partition_id: (s.server_id, p.generation) for s in view.assignment.servers for p in s.partitions
    }
    servers = []
    for descriptor in view.servers:
        metrics = by_server_id.get(descriptor.server_id)
        servers.append(
            {
                "server_id": descriptor.server_id,
                "endpoint": f"{descriptor.host}:{descriptor.port}",
                "http": metrics.http if metrics else None,
                "healthy": metrics.healthy if metrics else None,
                "partitions": sorted(view.partitions_of(descriptor.server_id)),
            }
        )
    partitions = []
    for partition_id in range(view.num_partitions):
        owner, generation = generations.get(partition_id, (None, NO_VALUE))
        metrics = by_server_id.get(owner) if owner is not None else None
        group = f"{SERVER_PREFIX}partition-{partition_id}."
        high_water_mark = int(metrics.gauge(group + "high-water-mark")) if metrics else NO_VALUE
        metadata = view.partition_metadata.get(partition_id)
        replicas = []
        for state in metadata.replica_states if metadata is not None else ():
            replicas.append(
                {
                    "storage": state.replica_id.storage,
                    "session_id": state.session_id,
                    "closing_high_water_mark": None if state.is_unresolved else state.closing_high_water_mark,
                }
            )
        interval_before = before.get(metrics.http) if metrics else None
        partitions.append(
            {
                "partition": partition_id,
                "server_id": owner,
                "generation": generation,
                "high_water_mark": high_water_mark,
                "store_session_id": metadata.session_id if metadata is not None else None,
                "replicas": replicas,
                "append_per_s": round(_rate(metrics, interval_before, group + "transaction", interval_s), 1)
                if metrics
                else 0.0,
                "committed_per_s": round(
                    _rate(metrics, interval_before, group + "successful-append", interval_s), 1
                )
                if metrics
                else 0.0,
                "feeds": _active_feeds(metrics, group) if metrics else 0,
            }
        )
    storages = sorted((_storage_row(n, http[n.http], partitions) for n in storage_nodes), key=_by_storage)
    cluster = {
        "root": settings.cluster_root,
        "partitions": view.num_partitions,
        "storage_nodes": sorted(view.replica_assignments),
        "under_replicated": _under_replicated(view.replica_assignments, set(http.values()), storages),
    }
    return Snapshot(now, cluster, servers, storages, partitions, nodes)


def _under_replicated(
    assignments: Mapping[str, Iterable[int]], known: set[str], storages: Iterable[dict[str, Any]]
) -> int:
    """Partitions with an assigned replica on a node (of those top watches) that is down or does
    not hold it: `cluster under-replicated` also finds the replicas behind, and says why."""
    held = {row["storage"]: {r["partition"] for r in row["replicas"]} for row in storages}
    short = {p for s, ids in assignments.items() if s in known for p in ids if p not in held.get(s, ())}
    return len(short)


def _active_feeds(metrics: NodeMetrics, group: str) -> int:
    added = metrics.gauge(group + "total-real-time-feed-context-added", 0)
    removed = metrics.gauge(group + "total-real-time-feed-context-removed", 0)
    return int(added) - int(removed)


def _by_storage(row: dict[str, Any]) -> tuple[str, int]:
    host, _, port = str(row["storage"]).rpartition(":")
    return host, int(port) if port.isdigit() else 0


def _storage_row(node: NodeMetrics, name: str, partitions: Iterable[dict[str, Any]]) -> dict[str, Any]:
    replicas = []
    for row in partitions:
        group = f"{STORAGE_PREFIX}partition-{row['partition']}."
        max_txid = node.gauges.get(group + "max-transaction-id")
        if max_txid is None:
            continue
        lag = row["high_water_mark"] - int(max_txid) if row["high_water_mark"] != NO_VALUE else None
        replicas.append(
            {
                "partition": row["partition"],
                "session_id": node.gauges.get(group + "session-id"),
                "max_transaction_id": int(max_txid),
                "lag": lag,
            }
        )
    return {"storage": name, "http": node.http, "healthy": node.healthy, "replicas": replicas}


# --- the live view ---------------------------------------------------------------------------------

QUIT_KEYS = ("q", "Q")


def render(snapshot: Snapshot, live: bool = True) -> RenderableType:
    """The snapshot as tables: filling the terminal for the live view, else at their own width
    (a pipe or a file gets whole lines) under a title with the time it was taken."""
    servers = Table(title="servers", expand=live)
    for column in ("id", "endpoint", "http", "health", "partitions"):
        servers.add_column(column)
    for s in snapshot.servers:
        health = "?" if s["healthy"] is None else ("ok" if s["healthy"] else "UNHEALTHY")
        servers.add_row(str(s["server_id"]), s["endpoint"], s["http"] or "-", health, str(s["partitions"]))
    partitions = Table(title="partitions", expand=live)
    for column in (
        "p",
        "server",
        "gen",
        "hwm",
        "store session",
        "replicas (session)",
        "append/s",
        "commit/s",
        "feeds",
    ):
        partitions.add_column(column)
    for p in snapshot.partitions:
        replicas = ", ".join(f"{r['storage']}({r['session_id']})" for r in p["replicas"])
        partitions.add_row(
            str(p["partition"]),
            str(p["server_id"]),
            str(p["generation"]),
            str(p["high_water_mark"]),
            str(p["store_session_id"]),
            replicas,
            f"{p['append_per_s']:.1f}",
            f"{p['committed_per_s']:.1f}",
            str(p["feeds"]),
        )
    storages = Table(title="storage replicas", expand=live)
    for column in ("storage", "health", "partition", "session", "max txid", "lag"):
        storages.add_column(column)
    for node in snapshot.storages:
        for r in node["replicas"]:
            storages.add_row(
                node["storage"],
                "ok" if node["healthy"] else "UNHEALTHY",
                str(r["partition"]),
                str(r["session_id"]),
                str(r["max_transaction_id"]),
                "-" if r["lag"] is None else str(r["lag"]),
            )
    title = (
        f"waltz top — {snapshot.cluster['root']} ({snapshot.cluster['partitions']} partitions, "
        f"{snapshot.cluster['under_replicated']} under-replicated)"
    )
    if live:
        title += " — q quits"
    else:
        title += " — " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.wall_time_s))
    return Group(title, servers, partitions, storages)


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A function that waits up to N seconds for a key; stdin in cbreak mode when it is a TTY."""
    if not sys.stdin.isatty():

        def sleep_only(timeout_s: float) -> str:
            time.sleep(timeout_s)
            return ""

        yield sleep_only
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read_key(timeout_s: float) -> str:
        ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
        return sys.stdin.read(1) if ready else ""

    try:
        yield read_key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def watch(settings: ZooKeeperSettings, http: Mapping[str, str], interval_s: float) -> Iterator[Snapshot]:
    """A snapshot now, then one every ``interval_s``, for ever (rates over each interval)."""
    snapshot = take_snapshot(settings, http)
    while True:
        yield snapshot
        time.sleep(max(0.0, snapshot.taken_at + interval_s - time.monotonic()))
        snapshot = take_snapshot(settings, http, snapshot)


def run_live(
    settings: ZooKeeperSettings, http: Mapping[str, str], interval_s: float, console: Console
) -> None:
    """Refresh every ``interval_s`` until ``q`` (or Ctrl-C, which the caller handles)."""
    snapshot = take_snapshot(settings, http)
    with _keys() as wait_key, Live(render(snapshot), console=console, auto_refresh=False) as live:
        while True:
            deadline = time.monotonic() + interval_s
            while (remaining := deadline - time.monotonic()) > 0:
                if wait_key(remaining) in QUIT_KEYS:
                    return
            snapshot = take_snapshot(settings, http, snapshot)
            live.update(render(snapshot), refresh=True)
