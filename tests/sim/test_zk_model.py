"""The ZooKeeper model's own behaviour (what a real ensemble cannot be made to do on demand in a
test: an outage, a session timing out on the loop's clock) and the product's cluster manager
running on it through the coordination seam."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss
from kazoo.handlers.threading import KazooTimeoutError

from waltz_engine.client.driver import ZooKeeperDriver
from waltz_engine.net.tls import TlsConfig
from waltz_engine.sim.zk_model import SimZkClient, SimZooKeeper
from waltz_engine.zk.cluster import create_cluster
from waltz_engine.zk.cluster_manager import ClusterManager, ClusterState, ManagedServer
from waltz_engine.zk.connection import ZooKeeperSettings, connect

SHORT_SESSION_MS = 20  # sessions here time out on the loop's clock; short keeps the test quick
WAIT_TIMEOUT_S = 10.0  # reached only when the model is broken
ROOT = "/model/cluster"
NUM_PARTITIONS = 4


class InlineExecutor(ThreadPoolExecutor):
    """Runs ``to_thread`` work on the loop's thread at once, as the simulator's loop does: the
    model then sees one caller at a time."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future


def on_model_loop(scenario: Callable[[SimZooKeeper, list[str]], Coroutine[Any, Any, None]]) -> None:
    """Run ``scenario(zk, trace)`` on a fresh loop with an inline executor."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(InlineExecutor())
        trace: list[str] = []
        await scenario(SimZooKeeper(loop, trace=trace.append), trace)

    asyncio.run(main())


def settings(session_timeout_ms: int = SHORT_SESSION_MS) -> ZooKeeperSettings:
    return ZooKeeperSettings("sim:2181", ROOT, session_timeout_ms)


class States:
    """A client's connection states as its listeners hear them, awaitable."""

    def __init__(self, client: SimZkClient) -> None:
        self.seen: list[str] = []
        self._changed = asyncio.Event()
        client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        self.seen.append(state)
        self._changed.set()

    async def wait_for(self, *states: str) -> None:
        async with asyncio.timeout(WAIT_TIMEOUT_S):
            while self.seen[-len(states) :] != list(states):
                self._changed.clear()
                await self._changed.wait()


def test_a_cut_off_session_expires_after_its_timeout_and_takes_its_ephemerals() -> None:
    on_model_loop(cut_off_session_expires)


async def cut_off_session_expires(zk: SimZooKeeper, trace: list[str]) -> None:
    owner, other = zk.new_client(settings()), zk.new_client(settings(60_000))
    states = States(owner)
    owner.start()
    other.start()
    owner.create("/eph", b"", ephemeral=True)
    first_session = owner.client_id
    zk.isolate(owner)
    with pytest.raises(ConnectionLoss):
        owner.get("/eph")
    await states.wait_for("CONNECTED", "SUSPENDED")
    gone = asyncio.Event()
    other.exists("/eph", watch=lambda _event: gone.set())
    async with asyncio.timeout(WAIT_TIMEOUT_S):
        await gone.wait()  # the session timer fired on the loop
    assert other.exists("/eph") is None
    zk.heal(owner)
    await states.wait_for("LOST", "CONNECTED")
    assert owner.client_id != first_session
    assert owner.exists("/eph") is None


def test_a_short_outage_keeps_sessions_and_a_long_one_expires_them() -> None:
    on_model_loop(outage)


async def outage(zk: SimZooKeeper, trace: list[str]) -> None:
    durable, brief = zk.new_client(settings(60_000)), zk.new_client(settings())
    durable_states, brief_states = States(durable), States(brief)
    durable.start()
    brief.start()
    durable.create("/durable", b"", ephemeral=True)
    brief.create("/brief", b"", ephemeral=True)
    zk.start_outage()
    for client in (durable, brief):
        with pytest.raises(ConnectionLoss):
            client.set("/durable", b"x")
    late = zk.new_client(settings())
    with pytest.raises(KazooTimeoutError):
        late.start()
    waiting = zk.new_client(settings())
    waiting_states = States(waiting)
    waiting.start_async()  # connects once the ensemble is back
    await brief_states.wait_for("CONNECTED", "SUSPENDED")
    assert brief.client_id is not None
    expired = asyncio.Event()
    zk._trace = lambda event: expired.set() if event.endswith("expires") else None
    async with asyncio.timeout(WAIT_TIMEOUT_S):
        await expired.wait()  # the expiry timer ran on the loop's clock
    assert not zk.ephemerals_of(brief.client_id[0])
    zk.end_outage()
    await durable_states.wait_for("CONNECTED", "SUSPENDED", "CONNECTED")
    await brief_states.wait_for("SUSPENDED", "LOST", "CONNECTED")
    await waiting_states.wait_for("CONNECTED")
    assert durable.exists("/durable") is not None and durable.exists("/brief") is None
    brief.stop()
    with pytest.raises(ConnectionClosedError):
        brief.get("/durable")


def test_data_watch_follows_changes_and_resumes_after_reconnecting() -> None:
    on_model_loop(data_watch)


async def data_watch(zk: SimZooKeeper, trace: list[str]) -> None:
    watcher, writer = zk.new_client(settings(60_000)), zk.new_client(settings(60_000))
    watcher.start()
    writer.start()
    seen: list[bytes | None] = []
    changed = asyncio.Event()

    def on_data(data: bytes | None, _stat: object) -> bool:
        seen.append(data)
        changed.set()
        return data != b"stop"

    async def next_value() -> None:
        async with asyncio.timeout(WAIT_TIMEOUT_S):
            await changed.wait()
        changed.clear()

    watcher.DataWatch("/w", on_data)
    assert seen == [None]  # called at once, as kazoo does, with no znode yet
    changed.clear()
    writer.create("/w", b"1")
    await next_value()
    zk.isolate(watcher)
    writer.set("/w", b"2")  # missed while cut off: read again on reconnecting
    zk.heal(watcher)
    await next_value()
    writer.set("/w", b"stop")
    await next_value()
    writer.set("/w", b"after")
    writer.sync("/w")
    await asyncio.sleep(0)
    assert seen == [None, b"1", b"2", b"stop"]


@asynccontextmanager
async def managed_server(zk: SimZooKeeper, port: int) -> AsyncIterator[tuple[ClusterManager, Any]]:
    with connect(settings(), zk.connector()) as client:
        manager = ClusterManager(client, ROOT)
        await manager.start()
        await manager.manage(ManagedServer("localhost", port, lambda _p: None))
        try:
            yield manager, client
        finally:
            await manager.close()


def owners(state: ClusterState) -> dict[int, int]:
    return {p.partition_id: s.server_id for s in state.assignment.servers for p in s.partitions}


def test_cluster_managers_on_the_model_fail_over_when_a_session_expires() -> None:
    on_model_loop(failover)


async def failover(zk: SimZooKeeper, trace: list[str]) -> None:
    with connect(settings(60_000), zk.connector()) as admin:
        create_cluster(admin, ROOT, "model", NUM_PARTITIONS)
    async with managed_server(zk, 1001) as (first, cut), managed_server(zk, 1002) as (second, _):
        both = await first.wait_for_state(lambda s: len(set(owners(s).values())) == 2, WAIT_TIMEOUT_S)
        assert len(owners(both)) == NUM_PARTITIONS
        zk.isolate(cut)  # its session times out; the survivor takes every partition
        alone = await second.wait_for_state(
            lambda s: set(owners(s).values()) == {second.server_id}, WAIT_TIMEOUT_S
        )
        assert len(owners(alone)) == NUM_PARTITIONS
        zk.heal(cut)  # a new session: the manager re-registers and gets partitions again
        await second.wait_for_state(lambda s: len(set(owners(s).values())) == 2, WAIT_TIMEOUT_S)
    assert any(event.endswith("expires") for event in trace)


def test_client_drivers_take_their_ids_and_the_cluster_from_the_model() -> None:
    on_model_loop(client_drivers)


async def client_drivers(zk: SimZooKeeper, trace: list[str]) -> None:
    with connect(settings(60_000), zk.connector()) as admin:
        create_cluster(admin, ROOT, "model", NUM_PARTITIONS)
    infos = []
    for _ in range(2):
        driver = ZooKeeperDriver(settings(60_000), TlsConfig(), zk_connector=zk.connector())
        infos.append(await driver.start(lambda _endpoints: None, lambda _endpoint: None))
        await driver.close()
    assert [(i.client_id, i.cluster_name, i.num_partitions) for i in infos] == [
        (1, "model", NUM_PARTITIONS),
        (2, "model", NUM_PARTITIONS),
    ]
