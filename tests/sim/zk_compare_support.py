"""Run one ZooKeeper operation script on the model and on a real ensemble, recording comparable logs.

A script is a function of a :class:`Side`: it opens clients by label, runs calls through
``side.run(label, ...)`` (the result or the error's class goes to that client's log), registers
watches from ``side.watcher(label, name)``; listeners log each connection state. Each client has
two logs, ``<label>.calls`` (results, in script order) and ``<label>.events`` (states and watch
events, in delivery order): ZooKeeper orders one client's events, not different clients' against
each other, nor a call's answer against the callbacks kazoo runs on its own thread.

Values that legitimately differ are normalised: zxids become their rank among the zxids the run
observed (order and equality are what ZooKeeper promises), an ephemeral owner becomes
``self``/``other``, children are sorted (a real ensemble lists them in hash order), times dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import Callback, WatchedEvent, ZnodeStat

from waltz_engine.net.tcp_proxy import TcpProxy
from waltz_engine.sim.zk_model import SimZkClient, SimZooKeeper
from waltz_engine.zk.connection import ZooKeeperSettings

REAL_CALL_TIMEOUT_S = 30.0  # bounds every wait on the real ensemble; reached only when it breaks
SESSION_TIMEOUT_MS = 4_000  # the embedded ZooKeeper's minimum (two ticks of 2 s)
MODEL_SETTLE_ROUNDS = 100  # loop iterations that drain the model's deliveries (a few are used)

_KAZOO_LOGGER = logging.getLogger("tests.sim.kazoo")
_KAZOO_LOGGER.addHandler(logging.NullHandler())


class Zxid(int):
    """A zxid in a log entry, replaced by its rank when the run is over."""


Entry = tuple[Any, ...]
SETTLED: Entry = ("settled",)


class Side:
    """Clients of one ensemble and their logs; subclasses say how to reach, cut and settle it."""

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}
        self.logs: dict[str, list[Entry]] = {}
        self._changed = threading.Condition()

    # --- what scripts call -----------------------------------------------------------------------

    def open(self, label: str) -> Any:
        self.logs[f"{label}.calls"], self.logs[f"{label}.events"] = [], []
        client = self.clients[label] = self._new_client(label)
        client.add_listener(lambda state: self.record(label, ("state", state)))
        client.start(timeout=REAL_CALL_TIMEOUT_S)
        self.settle()
        return client

    def run(self, label: str, call: Callable[[Any], Any]) -> Any:
        client = self.clients[label]
        try:
            result = call(client)
        except Exception as e:
            self.record(label, ("error", type(e).__name__), "calls")
            return None
        self.record(label, ("ok", normalise(result, client)), "calls")
        return result

    def watcher(self, label: str, name: str) -> Callable[[WatchedEvent], None]:
        def watch(event: WatchedEvent) -> None:
            self.record(label, ("watch", name, event.type, event.state, event.path))

        return watch

    def record(self, label: str, entry: Entry, log: str = "events") -> None:
        with self._changed:
            self.logs[f"{label}.{log}"].append(entry)
            self._changed.notify_all()

    def stop(self, label: str) -> None:
        client = self.clients[label]
        client.stop()
        client.close()

    def stop_all(self) -> None:
        for client in self.clients.values():
            client.stop()
            client.close()

    # --- what each side implements ---------------------------------------------------------------

    def _new_client(self, label: str) -> Any:
        raise NotImplementedError

    def settle(self) -> None:
        """Every event caused so far has been delivered to every open client; the logs mark it
        (kazoo keeps one path's watches in a set: events between two marks have no order)."""
        self._settle()
        for label in list(self.logs):
            if label.endswith(".events"):
                self.record(label.rpartition(".")[0], SETTLED)

    def _settle(self) -> None:
        raise NotImplementedError

    def cut(self, label: str) -> None:
        raise NotImplementedError

    def heal(self, label: str) -> None:
        raise NotImplementedError

    def expire_cut(self, label: str, witness: str, witness_entry: Entry) -> None:
        """Let the cut client's session expire; ``witness`` logs ``witness_entry`` when it has."""
        raise NotImplementedError

    def wait_for(self, label: str, entry: Entry) -> None:
        raise NotImplementedError


class ModelSide(Side):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.zk = SimZooKeeper(self.loop, clock_ms=lambda: 0)

    def _new_client(self, label: str) -> SimZkClient:
        return self.zk.new_client(ZooKeeperSettings("sim:1", "/", SESSION_TIMEOUT_MS))

    def _settle(self) -> None:
        for _ in range(MODEL_SETTLE_ROUNDS):
            if not self.loop._ready:  # type: ignore[attr-defined]
                return
            self.loop.call_soon(self.loop.stop)
            self.loop.run_forever()
        raise AssertionError("the model kept delivering events")

    def cut(self, label: str) -> None:
        self.zk.isolate(self.clients[label])
        self.settle()

    def heal(self, label: str) -> None:
        self.zk.heal(self.clients[label])
        self.settle()

    def expire_cut(self, label: str, witness: str, witness_entry: Entry) -> None:
        client_id = self.clients[label].client_id
        assert client_id is not None
        self.zk.expire(client_id[0])
        self.wait_for(witness, witness_entry)

    def wait_for(self, label: str, entry: Entry) -> None:
        self._settle()
        log = self.logs[f"{label}.events"]
        assert entry in log, f"{label} never logged {entry}: {log}"

    def close(self) -> None:
        self.stop_all()
        self._settle()
        self.loop.close()


class RealSide(Side):
    """Each client reaches the real ensemble through its own TCP proxy, so one can be cut off."""

    def __init__(self, connect_string: str) -> None:
        super().__init__()
        host, _, port = connect_string.rpartition(":")
        self._target = (host, int(port))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zk-proxies", daemon=True)
        self._thread.start()
        self._proxies: dict[str, TcpProxy] = {}

    def _on_loop(self, make: Callable[[], Any]) -> Any:
        async def call() -> Any:
            result = make()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(REAL_CALL_TIMEOUT_S)

    def _new_client(self, label: str) -> KazooClient:
        proxy = self._proxies[label] = self._on_loop(lambda: TcpProxy(*self._target).start())
        return KazooClient(
            hosts=proxy.connect_string, timeout=SESSION_TIMEOUT_MS / 1000, logger=_KAZOO_LOGGER
        )

    def _settle(self) -> None:
        # A watch event reaches a client before the answer to its next request, and kazoo runs
        # callbacks in order: a marker queued after that answer runs after every such event.
        for client in self.clients.values():
            if not client.connected:
                continue
            client.exists("/")
            done = threading.Event()
            client.handler.dispatch_callback(Callback("watch", done.set, ()))
            assert done.wait(REAL_CALL_TIMEOUT_S), "kazoo's callback thread is stuck"

    def cut(self, label: str) -> None:
        proxy = self._proxies[label]

        def cut_now() -> None:
            proxy.refuse = True
            proxy.disconnect_all()

        self._on_loop(cut_now)
        self.wait_for(label, ("state", "SUSPENDED"))
        self.settle()

    def heal(self, label: str) -> None:
        proxy = self._proxies[label]
        self._on_loop(lambda: setattr(proxy, "refuse", False))
        self.wait_for(label, ("state", "CONNECTED"), after=("state", "SUSPENDED"))
        self.settle()

    def expire_cut(self, label: str, witness: str, witness_entry: Entry) -> None:
        self.wait_for(witness, witness_entry)  # the ensemble expires it after the session timeout

    def wait_for(self, label: str, entry: Entry, after: Entry | None = None) -> None:
        log = self.logs[f"{label}.events"]

        def seen() -> bool:
            start = len(log) - log[::-1].index(after) if after is not None and after in log else 0
            return entry in log[start:]

        with self._changed:
            assert self._changed.wait_for(seen, REAL_CALL_TIMEOUT_S), f"{label} never logged {entry}: {log}"

    def close(self) -> None:
        self.stop_all()
        for proxy in self._proxies.values():
            self._on_loop(proxy.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(REAL_CALL_TIMEOUT_S)
        self._loop.close()


@contextmanager
def model_side() -> Iterator[ModelSide]:
    side = ModelSide()
    try:
        yield side
    finally:
        side.close()


@contextmanager
def real_side(connect_string: str) -> Iterator[RealSide]:
    side = RealSide(connect_string)
    try:
        yield side
    finally:
        side.close()


def normalise(value: Any, client: Any) -> Any:
    if isinstance(value, ZnodeStat):
        session = client.client_id[0] if client.client_id is not None else None
        owner = value.ephemeralOwner
        return {
            "czxid": Zxid(value.czxid),
            "mzxid": Zxid(value.mzxid),
            "pzxid": Zxid(value.pzxid),
            "version": value.version,
            "cversion": value.cversion,
            "aversion": value.aversion,
            "dataLength": value.dataLength,
            "numChildren": value.numChildren,
            "ephemeral": "none" if owner == 0 else "self" if owner == session else "other",
        }
    if isinstance(value, list):
        return sorted(value)
    if isinstance(value, tuple):
        return tuple(normalise(v, client) for v in value)
    return value


def ranked(logs: dict[str, list[Entry]]) -> dict[str, list[Entry]]:
    """The logs with every zxid replaced by its rank among all zxids they hold."""
    found: set[int] = set()

    def collect(value: Any) -> None:
        if isinstance(value, Zxid):
            found.add(int(value))
        elif isinstance(value, (tuple, list)):
            for v in value:
                collect(v)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)

    collect(list(logs.values()))
    rank = {z: i for i, z in enumerate(sorted(found))}

    def replace(value: Any) -> Any:
        if isinstance(value, Zxid):
            return ("zxid", rank[int(value)])
        if isinstance(value, tuple):
            return tuple(replace(v) for v in value)
        if isinstance(value, list):
            return [replace(v) for v in value]
        if isinstance(value, dict):
            return {k: replace(v) for k, v in value.items()}
        return value

    return {label: replace(log) for label, log in logs.items()}


def comparable(logs: dict[str, list[Entry]]) -> dict[str, list[Entry]]:
    """Ranked logs with the events between two settle marks in a canonical order."""
    result: dict[str, list[Entry]] = {}
    for label, log in ranked(logs).items():
        if not label.endswith(".events"):
            result[label] = log
            continue
        ordered: list[Entry] = []
        group: list[Entry] = []
        for entry in [*log, SETTLED]:
            if entry == SETTLED:
                ordered.extend(sorted(group, key=repr))
                ordered.append(entry)
                group = []
            else:
                group.append(entry)
        result[label] = ordered[:-1]
    return result
