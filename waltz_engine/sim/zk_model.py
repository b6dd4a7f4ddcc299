"""An in-memory ZooKeeper ensemble and kazoo-like clients for the deterministic simulator.

Only the kazoo subset the product uses is modelled, with kazoo's exception classes, states and
``ZnodeStat``: ``get``/``exists``/``get_children`` with one-shot watches, ``create`` (ephemeral,
sequential, ``makepath``), ``set`` and ``delete`` with versions, ``ensure_path``, ``sync``,
the ``*_async`` calls the storage node makes, ``DataWatch``, connection-state listeners, and
``start``/``start_async``/``stop``/``close``. ``tests/sim/test_zk_model_vs_real.py`` runs the
same sequences here and on a real ZooKeeper and compares them.

Calls complete at once (there is no I/O); watch events and state changes are delivered on the
loop with ``call_soon``, as kazoo delivers them on its event thread, so a run stays a function
of its seed. Where kazoo would block a caller (a call while disconnected waits for the
connection), the model raises ``ConnectionLoss`` instead: a simulated process has no thread to
block, and the product handles that error on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState, KeeperState, WatchedEvent, ZnodeStat

from waltz_engine.sim.loop import CURRENT_HOST, Incarnation

if TYPE_CHECKING:
    from waltz_engine.zk.connection import ZooKeeperConnector, ZooKeeperSettings

ANY_VERSION = -1
# Session ids look like a real ensemble's (server id in the top byte) and count up from here.
FIRST_SESSION_ID = 0x0100_0000_0000_0001
SEQUENCE_FORMAT = "{:010d}"  # ZooKeeper's suffix: ten digits

Watcher = Callable[[WatchedEvent], Any]
Listener = Callable[[str], Any]


@dataclass
class _Znode:
    data: bytes | None
    czxid: int
    ctime_ms: int
    ephemeral_owner: int
    mzxid: int = 0
    mtime_ms: int = 0
    pzxid: int = 0
    version: int = 0
    cversion: int = 0  # counts children created and deleted
    creates: int = 0  # children created: a real ensemble's sequence numbers count only these
    children: dict[str, None] = field(default_factory=dict)  # an ordered set

    def stat(self) -> ZnodeStat:
        return ZnodeStat(
            self.czxid,
            self.mzxid,
            self.ctime_ms,
            self.mtime_ms,
            self.version,
            self.cversion,
            0,  # aversion: ACLs are not modelled
            self.ephemeral_owner,
            len(self.data) if self.data is not None else 0,
            len(self.children),
            self.pzxid,
        )


@dataclass
class _Session:
    session_id: int
    timeout_ms: int
    client: SimZkClient
    expired: bool = False
    expiry: asyncio.TimerHandle | None = None


def _parent(path: str) -> str:
    parent = path.rpartition("/")[0]
    return parent or "/"


def _check_path(path: str) -> str:
    if not isinstance(path, str):
        raise TypeError("Invalid type for 'path' (string expected)")
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise ValueError(f"invalid znode path {path!r}")
    return path


def _check_value(value: object) -> None:
    if value is not None and not isinstance(value, bytes):
        raise TypeError("Invalid type for 'value' (must be a byte string)")


class SimZooKeeper:
    """The ensemble: znodes, sessions and their expiry, reachability (an outage, isolated clients)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        clock_ms: Callable[[], int] | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        """``loop``: where watches and state changes are delivered (default: the running loop at the
        time of delivery); ``clock_ms``: the znodes' ctime/mtime (default: the loop's time);
        ``trace``: told each fault and session event in words (the world's event trace)."""
        self._loop = loop
        self._clock_ms = clock_ms
        self._trace = trace
        self._zxid = 0
        self._session_ids = itertools.count(FIRST_SESSION_ID)
        self._sessions: dict[int, _Session] = {}
        self._nodes: dict[str, _Znode] = {"/": _Znode(None, 0, 0, 0)}
        self._outage = False
        self._isolated: set[int] = set()  # ids of clients cut off from the ensemble
        self._client_ids = itertools.count(1)
        self._started: dict[int, SimZkClient] = {}  # started clients (they reconnect), by number

    # --- the world's controls ---------------------------------------------------------------

    def new_client(self, settings: ZooKeeperSettings) -> SimZkClient:
        """A client, not started (as :func:`waltz_engine.zk.connection.new_client`)."""
        return SimZkClient(self, next(self._client_ids), settings.session_timeout_ms)

    def connector(self) -> ZooKeeperConnector:
        """The factory the product receives in place of the real one."""
        return cast("ZooKeeperConnector", self.new_client)

    @property
    def in_outage(self) -> bool:
        return self._outage

    def start_outage(self) -> None:
        """Every client loses its connection; sessions expire after their timeout."""
        self._outage = True
        self.trace("zookeeper outage begins")
        for session in list(self._sessions.values()):
            session.client._lose_connection()

    def end_outage(self) -> None:
        self._outage = False
        self.trace("zookeeper outage ends")
        self._reconnect_reachable()

    def isolate(self, client: SimZkClient) -> None:
        """Cut one client off (a network partition between it and the ensemble)."""
        self._isolated.add(client.client_number)
        self.trace(f"zookeeper client {client.client_number} cut off")
        client._lose_connection()

    def heal(self, client: SimZkClient) -> None:
        self._isolated.discard(client.client_number)
        self.trace(f"zookeeper client {client.client_number} reconnects")
        self._reconnect_reachable()

    def kill(self, client: SimZkClient) -> None:
        """The client's machine died: the ensemble stops hearing it and expires its session after
        its timeout (never closed politely), and nothing more is delivered to the dead process."""
        self.trace(f"zookeeper client {client.client_number} dies")
        self._started.pop(client.client_number, None)
        client._started = client._connected = False
        client._listeners.clear()
        client._data_watchers.clear()
        client._child_watchers.clear()
        session = client._session
        if session is not None and not session.expired:
            self._schedule_expiry(session)

    def kill_host(self, host: str) -> None:
        """Every client made by ``host``'s code dies with its machine (:meth:`kill`)."""
        clients = {c.client_number: c for c in self._started.values() if c.host_name == host}
        clients.update(
            (s.client.client_number, s.client) for s in self._sessions.values() if s.client.host_name == host
        )
        for number in sorted(clients):
            self.kill(clients[number])

    def expire(self, session_id: int) -> None:
        """The ensemble expires a session now: its ephemerals go. A connected client is dropped (an
        ensemble expires only sessions it stopped hearing from) and learns on reconnecting."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        self.trace(f"zookeeper session {session_id:#x} expires")
        self._end_session(session)
        client = session.client
        if client._session is session and client._connected:
            client._lose_connection()
            if self.reachable(client):
                client._regain_connection()

    def trace(self, event: str) -> None:
        if self._trace is not None:
            self._trace(event)

    def reachable(self, client: SimZkClient) -> bool:
        return not self._outage and client.client_number not in self._isolated

    def ephemerals_of(self, session_id: int) -> list[str]:
        return [path for path, node in self._nodes.items() if node.ephemeral_owner == session_id]

    # --- sessions --------------------------------------------------------------------------------

    def _open_session(self, client: SimZkClient, timeout_ms: int) -> _Session:
        session = _Session(next(self._session_ids), timeout_ms, client)
        self._sessions[session.session_id] = session
        return session

    def _schedule_expiry(self, session: _Session) -> None:
        if session.expiry is None and not session.expired:
            # The ensemble's own timer: in no host's context, so no host's death cancels it.
            session.expiry = self.loop().call_later(
                session.timeout_ms / 1000, self.expire, session.session_id, context=contextvars.Context()
            )

    def _cancel_expiry(self, session: _Session) -> None:
        if session.expiry is not None:
            session.expiry.cancel()
            session.expiry = None

    def _end_session(self, session: _Session) -> None:
        """Close or expire: the session's ephemeral znodes are deleted, oldest first."""
        self._cancel_expiry(session)
        session.expired = True
        self._sessions.pop(session.session_id, None)
        for path in sorted(self.ephemerals_of(session.session_id), key=lambda p: self._nodes[p].czxid):
            self._delete(path, ANY_VERSION)

    def _reconnect_reachable(self) -> None:
        for number in sorted(self._started):
            client = self._started[number]
            if self.reachable(client):
                client._regain_connection()

    # --- delivery ----------------------------------------------------------------------------------

    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop if self._loop is not None else asyncio.get_running_loop()

    def deliver(self, callback: Callable[..., Any], *args: Any, host: Incarnation | None = None) -> None:
        """Run ``callback`` on the loop, as the code of ``host`` (the client's) in the simulator."""
        loop = self.loop()
        if loop.is_closed():
            return  # a session ended after its loop: nobody is left to watch
        if asyncio._get_running_loop() is loop:
            loop.call_soon(callback, *args, context=host.context if host is not None else None)
        else:  # a worker thread of a real loop (the tests that compare with a real ZooKeeper)
            loop.call_soon_threadsafe(callback, *args)

    def _now_ms(self) -> int:
        if self._clock_ms is not None:
            return self._clock_ms()
        return int(self.loop().time() * 1000)

    def _notify(self, path: str, event_type: str) -> None:
        """Fire the one-shot watches a change to ``path`` triggers, on every live client."""
        for session in list(self._sessions.values()):
            session.client._fire(path, event_type)

    # --- operations (the server side) ------------------------------------------------------------

    def _node(self, path: str) -> _Znode:
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError()
        return node

    def _create(self, path: str, value: bytes | None, owner: int, sequence: bool) -> str:
        parent = self._nodes.get(_parent(path))
        if parent is None:
            raise NoNodeError()
        if parent.ephemeral_owner:
            raise NoChildrenForEphemeralsError()
        if sequence:
            path += SEQUENCE_FORMAT.format(parent.creates)
        if path in self._nodes:
            raise NodeExistsError()
        self._zxid += 1
        now_ms = self._now_ms()
        self._nodes[path] = _Znode(value, self._zxid, now_ms, owner, self._zxid, now_ms, self._zxid)
        parent.children[path.rpartition("/")[2]] = None
        parent.cversion += 1
        parent.creates += 1
        parent.pzxid = self._zxid
        self._notify(path, EventType.CREATED)
        self._notify(_parent(path), EventType.CHILD)
        return path

    def _set(self, path: str, value: bytes | None, version: int) -> ZnodeStat:
        node = self._node(path)
        if version != ANY_VERSION and version != node.version:
            raise BadVersionError()
        self._zxid += 1
        node.data, node.mzxid, node.mtime_ms = value, self._zxid, self._now_ms()
        node.version += 1
        self._notify(path, EventType.CHANGED)
        return node.stat()

    def _delete(self, path: str, version: int) -> None:
        node = self._node(path)
        if version != ANY_VERSION and version != node.version:
            raise BadVersionError()
        if node.children:
            raise NotEmptyError()
        self._zxid += 1
        del self._nodes[path]
        parent = self._nodes[_parent(path)]
        del parent.children[path.rpartition("/")[2]]
        parent.cversion += 1
        parent.pzxid = self._zxid
        self._notify(path, EventType.DELETED)
        self._notify(_parent(path), EventType.CHILD)

    def _children(self, path: str) -> tuple[list[str], ZnodeStat]:
        node = self._node(path)
        return sorted(node.children), node.stat()


class _Result:
    """A finished kazoo ``IAsyncResult``: ``get()`` returns the value or raises the error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        try:
            self._value = call()
        except Exception as e:
            self._error = e

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def successful(self) -> bool:
        return self._error is None


class SimZkClient:
    """A kazoo ``KazooClient`` look-alike on a :class:`SimZooKeeper`."""

    def __init__(self, ensemble: SimZooKeeper, client_number: int, session_timeout_ms: int) -> None:
        self._zk = ensemble
        self.client_number = client_number
        self.host = CURRENT_HOST.get()  # whose process made it (None: the world's, or a test's)
        self._timeout_ms = session_timeout_ms
        self._session: _Session | None = None
        self._connected = False
        self._started = False  # between start and stop: reconnects on its own, as kazoo does
        self._client_state: str = KeeperState.CLOSED
        self._state: str = KazooState.LOST
        self._listeners: dict[Listener, None] = {}
        self._data_watchers: dict[str, dict[Watcher, None]] = {}
        self._child_watchers: dict[str, dict[Watcher, None]] = {}

    @property
    def host_name(self) -> str | None:
        return self.host.host if self.host is not None else None

    # --- lifecycle ----------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def client_state(self) -> str:
        return self._client_state

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        return (self._session.session_id, b"\x00" * 16) if self._session is not None else None

    def start(self, timeout: float = 15) -> None:
        """Connect; raises kazoo's timeout error (and stays stopped) while the ensemble is unreachable."""
        self.start_async()
        if not self._connected:
            self.stop()
            raise KazooTimeoutError("Connection time-out")

    def start_async(self) -> _Result:
        if not self._started:
            self._started = True
            self._client_state = KeeperState.CONNECTING
            self._zk._started[self.client_number] = self
            if self._zk.reachable(self):
                self._regain_connection()
        return _Result(lambda: None)

    def stop(self) -> None:
        """Close the session (its ephemerals go at once); listeners hear LOST."""
        if not self._started:
            return
        self._started = False
        self._zk._started.pop(self.client_number, None)
        session, self._session = self._session, None
        if session is not None and not session.expired:
            self._zk._end_session(session)
        self._connected = False
        self._client_state = KeeperState.CLOSED
        self._change_state(KazooState.LOST)
        self._reset_watchers()

    def close(self) -> None:
        """Release what ``stop`` left (nothing here)."""

    def add_listener(self, listener: Listener) -> None:
        self._listeners[listener] = None

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.pop(listener, None)

    # --- calls ----------------------------------------------------------------------------------

    def _live_session(self) -> _Session:
        if not self._started:
            raise ConnectionClosedError("Connection has been closed")
        if not self._connected or self._session is None:
            raise ConnectionLoss()  # kazoo would queue the call until it reconnects
        return self._session

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes | None, ZnodeStat]:
        self._live_session()
        node = self._zk._node(_check_path(path))
        self._watch(self._data_watchers, path, watch)
        return node.data, node.stat()

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        self._live_session()
        node = self._zk._nodes.get(_check_path(path))
        self._watch(self._data_watchers, path, watch)  # also when absent: fires on creation
        return node.stat() if node is not None else None

    def get_children(
        self, path: str, watch: Watcher | None = None, include_data: bool = False
    ) -> list[str] | tuple[list[str], ZnodeStat]:
        self._live_session()
        children, stat = self._zk._children(_check_path(path))
        self._watch(self._child_watchers, path, watch)
        return (children, stat) if include_data else children

    def create(
        self,
        path: str,
        value: bytes | None = b"",
        acl: object = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        session = self._live_session()
        _check_value(value)
        owner = session.session_id if ephemeral else 0
        try:
            return self._zk._create(_check_path(path), value, owner, sequence)
        except NoNodeError:
            if not makepath:
                raise
        self.ensure_path(_parent(path))
        return self._zk._create(path, value, owner, sequence)

    def ensure_path(self, path: str, acl: object = None) -> str | bool:
        """As kazoo: the path when this call created it, True when it was there already."""
        self._live_session()
        if self._zk._nodes.get(_check_path(path)) is not None:
            return True
        if path != "/":
            self.ensure_path(_parent(path))
        try:
            return self._zk._create(path, b"", 0, sequence=False)
        except NodeExistsError:
            return True

    def set(self, path: str, value: bytes | None, version: int = ANY_VERSION) -> ZnodeStat:
        self._live_session()
        _check_value(value)
        return self._zk._set(_check_path(path), value, version)

    def delete(self, path: str, version: int = ANY_VERSION, recursive: bool = False) -> bool | None:
        self._live_session()
        if not recursive:
            self._zk._delete(_check_path(path), version)
            return True
        try:  # kazoo's recursion: children first, vanished znodes ignored
            children, _ = self._zk._children(_check_path(path))
        except NoNodeError:
            return True
        for child in children:
            self.delete(f"{path.rstrip('/')}/{child}", recursive=True)
        with contextlib.suppress(NoNodeError):
            self._zk._delete(path, ANY_VERSION)
        return None  # kazoo's answer when the recursion ran

    def sync(self, path: str) -> str:
        self._live_session()
        return _check_path(path)

    def get_async(self, path: str, watch: Watcher | None = None) -> _Result:
        return _Result(lambda: self.get(path, watch))

    def sync_async(self, path: str) -> _Result:
        return _Result(lambda: self.sync(path))

    def DataWatch(self, path: str, func: Callable[..., Any]) -> DataWatch:  # noqa: N802 (kazoo's name)
        return DataWatch(self, path, func)

    # --- watches and connection states (the ensemble drives these) -----------------------------------

    def _watch(self, table: dict[str, dict[Watcher, None]], path: str, watch: Watcher | None) -> None:
        if watch is not None:
            table.setdefault(path, {})[watch] = None

    def _fire(self, path: str, event_type: str) -> None:
        watchers: list[Watcher] = []
        if event_type in (EventType.CREATED, EventType.CHANGED, EventType.DELETED):
            watchers.extend(self._data_watchers.pop(path, {}))
        if event_type in (EventType.DELETED, EventType.CHILD):
            watchers.extend(self._child_watchers.pop(path, {}))
        event = WatchedEvent(event_type, self._client_state, path)
        for watcher in watchers:
            self._zk.deliver(watcher, event, host=self.host)

    def _reset_watchers(self) -> None:
        """kazoo fires and forgets every watch when the connection drops (event type NONE)."""
        watchers = [
            w for table in (self._child_watchers, self._data_watchers) for ws in table.values() for w in ws
        ]
        self._child_watchers, self._data_watchers = {}, {}
        event = WatchedEvent(EventType.NONE, self._client_state, None)
        for watcher in watchers:
            self._zk.deliver(watcher, event, host=self.host)

    def _change_state(self, state: str) -> None:
        self._state = state
        self._zk.deliver(self._tell_listeners, state, host=self.host)

    def _tell_listeners(self, state: str) -> None:
        for listener in list(self._listeners):
            if listener(state) is True:  # kazoo: a listener returning True is removed
                self._listeners.pop(listener, None)

    def _lose_connection(self) -> None:
        if not self._connected:
            return
        self._connected = False
        self._client_state = KeeperState.CONNECTING
        self._change_state(KazooState.SUSPENDED)
        self._reset_watchers()
        if self._session is not None:
            self._zk._schedule_expiry(self._session)

    def _session_expired(self) -> None:
        """kazoo: LOST, every watch fired, then a new session on the next connection."""
        self._connected = False
        self._session = None
        self._client_state = KeeperState.EXPIRED_SESSION
        self._change_state(KazooState.LOST)
        self._reset_watchers()
        if self._started and self._zk.reachable(self):
            self._regain_connection()

    def _regain_connection(self) -> None:
        if not self._started or self._connected:
            return
        session = self._session
        if session is not None and session.expired:
            self._session_expired()
            return
        if session is None:
            self._session = self._zk._open_session(self, self._timeout_ms)
        else:
            self._zk._cancel_expiry(session)
        self._connected = True
        self._client_state = KeeperState.CONNECTED
        self._change_state(KazooState.CONNECTED)


class DataWatch:
    """kazoo's ``DataWatch`` recipe: ``func(data, stat)`` now and after every change of the znode
    (``None, None`` while it does not exist), again after a reconnection; False stops it."""

    def __init__(self, client: SimZkClient, path: str, func: Callable[..., Any]) -> None:
        self._client = client
        self._path = path
        self._func: Callable[..., Any] | None = func
        self._mzxid: int | None = None
        self._ever_called = False
        client.add_listener(self._on_state)
        self._get_data()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._client._zk.deliver(self._get_data, host=self._client.host)

    def _on_event(self, event: WatchedEvent) -> None:
        self._get_data(event)

    def _get_data(self, event: WatchedEvent | None = None) -> None:
        if self._func is None:
            return
        try:
            try:
                data, stat = self._client.get(self._path, self._on_event)
            except NoNodeError:
                data, stat = None, self._client.exists(self._path, self._on_event)
                if stat is not None:  # created between the two calls
                    self._client._zk.deliver(self._get_data, host=self._client.host)
                    return
        except (ConnectionLoss, ConnectionClosedError):
            return  # kazoo retries until connected; the CONNECTED listener reads again
        mzxid = stat.mzxid if stat is not None else None
        if mzxid != self._mzxid or not self._ever_called:
            self._mzxid, self._ever_called = mzxid, True
            if self._func(data, stat) is False:
                self._func = None
                self._client.remove_listener(self._on_state)
