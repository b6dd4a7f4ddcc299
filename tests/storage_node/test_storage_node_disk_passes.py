"""Issue 23 item 4: a storage node handles the requests for different partitions that reach it
together in one disk pass, and answers them with one write per connection, while each partition
keeps its order, its fencing, and its own disk errors.

Requests are sent "corked": every frame of a scenario leaves the client in one TLS record, so
the node reads them all in one loop turn and the pass count is exact.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from storage_node_support import (
    HTTP_TIMEOUT_S,
    ISSUED_SESSION_ID,
    StorageNodeProcess,
    create_test_cluster,
    make_records,
    start_storage_node,
)
from storage_support import FaultyDisk

from waltz_engine.storage.client import StorageClient, StorageRpcError
from waltz_engine.storage.node import connection_threads
from waltz_engine.storage.node.config import SYNC_SCOPE_FILE, SYNC_SCOPE_FILE_SYSTEM, StorageConfig
from waltz_engine.storage.node.connection_threads import MAX_CONNECTION_THREADS
from waltz_engine.storage.node.node import StorageNode

NUM_PARTITIONS = 16
SESSION_ID = ISSUED_SESSION_ID
# The whole run of a scenario may take this long before it counts as hung.
SCENARIO_TIMEOUT_S = 60.0


MAX_TURNS_TO_WRITE = 10_000  # loop turns for the calls to write their frames (they need a few)


class _Sink:
    """Stands in for a connection's transport: collects the frames the calls write."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(bytes(data))

    def writelines(self, pieces: Sequence[bytes]) -> None:
        self.chunks.append(b"".join(pieces))

    def is_closing(self) -> bool:
        return bool(self.real.is_closing())

    async def drain(self) -> None:
        pass


async def corked(client: StorageClient, calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run ``calls`` (one request each) with all their frames sent in one write; their results
    (or errors), in order."""
    conn = client._conn
    assert conn is not None
    # ``FramedConnection`` writes straight to its transport (not through the stream writer).
    sink = _Sink(conn._transport)
    conn._transport = sink  # type: ignore[assignment]
    try:
        tasks = [asyncio.ensure_future(call()) for call in calls]
        for _ in range(MAX_TURNS_TO_WRITE):
            if len(sink.chunks) >= len(calls):
                break
            await asyncio.sleep(0)
        assert len(sink.chunks) == len(calls), f"{len(sink.chunks)} of {len(calls)} frames written"
    finally:
        conn._transport = sink.real
    sink.real.write(b"".join(sink.chunks))
    return await asyncio.gather(*tasks, return_exceptions=True)


def _metrics(jetty_port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{jetty_port}/metrics"
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        metrics: dict[str, Any] = json.loads(response.read())
    return metrics


def _counters(jetty_port: int) -> dict[str, int]:
    counters = _metrics(jetty_port)["counters"]
    return {name: value["count"] for name, value in counters.items() if name.startswith("waltz-storage.disk")}


async def _open_sessions(client: StorageClient, partitions: Sequence[int]) -> None:
    for p in partitions:
        await client.last_session_info(SESSION_ID, p)


@pytest.fixture(scope="module")
def node(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageNodeProcess]:
    node = start_storage_node(zookeeper, tmp_path_factory.mktemp("node"), NUM_PARTITIONS)
    try:
        yield node
    finally:
        assert node.terminate() == 0, node.log_text()


def test_appends_for_many_partitions_in_one_turn_take_one_pass(node: StorageNodeProcess) -> None:
    partitions = range(NUM_PARTITIONS)
    assert node.jetty_port is not None

    async def go() -> tuple[list[Any], dict[str, int], dict[str, int]]:
        client = node.data_client()
        await client.open()
        try:
            await _open_sessions(client, partitions)
            before = _counters(node.jetty_port or 0)
            results = await corked(
                client, [lambda p=p: client.append(SESSION_ID, p, make_records(0, 1, p)) for p in partitions]
            )
            return results, before, _counters(node.jetty_port or 0)
        finally:
            await client.close()

    results, before, after = node.run(go())
    assert results == [None] * NUM_PARTITIONS
    passes, batches = "waltz-storage.disk-passes", "waltz-storage.disk-pass-batches"
    assert after[passes] - before[passes] == 1
    assert after[batches] - before[batches] == NUM_PARTITIONS
    # On default settings (``storage.sync.scope`` auto): one sync of the whole disk for the pass
    # where the node found that safe (Linux 5.8+, ext4/xfs/btrfs), else each file's own.
    scope = _metrics(node.jetty_port)["gauges"]["waltz-storage.sync-scope"]["value"]
    shared = "waltz-storage.disk-pass-shared-syncs"
    assert after[shared] - before[shared] == (1 if scope.startswith("file-system") else 0), scope


def test_interleaved_partitions_keep_their_order_and_fencing(node: StorageNodeProcess) -> None:
    # Partitions of the module's node holding txid 0 and nothing more (the first test writes it;
    # run alone, or first on its worker, this test writes it itself).
    partitions, per_partition = range(8), 3
    first = 1

    async def go() -> tuple[list[Any], list[list[Any]]]:
        client = node.data_client()
        await client.open()
        try:
            await _open_sessions(client, partitions)
            for p in partitions:
                if await client.max_transaction_id(SESSION_ID, p) < first - 1:
                    await client.append(SESSION_ID, p, make_records(0, 1, p))
            calls: list[Callable[[], Awaitable[Any]]] = []
            for i in range(per_partition):
                for p in partitions:
                    records = make_records(first + i, 1, p)
                    calls.append(lambda p=p, records=records: client.append(SESSION_ID, p, records))
                    if p == 3 and i == 1:
                        # A fenced-out session between two of partition 3's appends.
                        stale = make_records(first + i + 1, 1, p)
                        calls.append(lambda p=p, stale=stale: client.append(SESSION_ID - 1, p, stale))
            results = await corked(client, calls)
            stored = [await client.records(SESSION_ID, p, first, 100) for p in partitions]
            return results, stored
        finally:
            await client.close()

    results, stored = node.run(go())
    refused = [r for r in results if r is not None]
    assert len(refused) == 1 and isinstance(refused[0], StorageRpcError), results
    assert "session id has changed" in str(refused[0])
    for p, records in zip(partitions, stored, strict=True):
        assert records == make_records(first, per_partition, p)


Scenario = Callable[[StorageNode, StorageClient, "asyncio.Future[bool]"], Awaitable[None]]


def run_in_process(
    zookeeper: str,
    tmp_path: Path,
    disk: FaultyDisk,
    slow: int,
    failing: int | None,
    scenario: Scenario,
    max_connection_threads: int = MAX_CONNECTION_THREADS,
    sync_scope: str = SYNC_SCOPE_FILE,
) -> None:
    """A node in this process on ``disk``, assigned partitions 0-3, with ``slow``'s fsync held
    until the scenario ends (or sets ``disk.release``) and ``failing``'s failing; the scenario
    gets the node, an open data client with every partition's session open, and a future that
    is done once the slow fsync has started. ``sync_scope``: each file's own sync by default (the
    faults are in the files' syncs), or one sync of the whole disk per pass of several."""
    root, key = create_test_cluster(zookeeper, 4)
    # Writes the node's configuration and picks its ports; the node runs in this process.
    host = StorageNodeProcess(zookeeper, root, key, 4, tmp_path / "node", jetty=False)

    async def go() -> None:
        config = StorageConfig.load(host.config_path)._replace(
            data_connection_threads=max_connection_threads, sync_scope=sync_scope
        )
        node = StorageNode(config, disk=disk)  # type: ignore[arg-type]
        await node.start()
        started = asyncio.get_running_loop().run_in_executor(None, disk.slow_started.wait)
        try:
            await host.with_admin(lambda a: a.set_partition_assignment([0, 1, 2, 3], True, False))
            assert node.manager is not None
            if failing is not None:
                disk.failing.add(node.manager.partition(failing).directory)
            disk.slow.add(node.manager.partition(slow).directory)
            client = host.data_client()
            await client.open()
            try:
                await _open_sessions(client, range(4))
                await scenario(node, client, started)
            finally:
                await client.close()
        finally:
            disk.release.set()
            await node.stop()

    async def bounded() -> None:
        async with asyncio.timeout(SCENARIO_TIMEOUT_S):
            await go()

    asyncio.run(bounded())


def late_batches(node: StorageNode) -> int:
    return node.metrics.counter("waltz-storage", "disk-pass-late-batches").count


def test_a_failing_or_slow_partition_does_not_hold_the_others(zookeeper: str, tmp_path: Path) -> None:
    """In-process, for the disk seam: partition 1's fsync fails, partition 2's hangs; partitions
    0 and 3 of the same pass are answered SUCCESS meanwhile, then partition 2 when it returns."""
    disk = FaultyDisk()

    async def scenario(node: StorageNode, client: StorageClient, started: asyncio.Future[bool]) -> None:
        appends = [lambda p=p: client.append(SESSION_ID, p, make_records(0, 1, p)) for p in range(4)]
        results = asyncio.ensure_future(corked(client, appends))
        await started  # partition 2 is inside its fsync
        # Partitions 0 and 3 answered while partition 2's fsync still waits.
        assert await client.max_transaction_id(SESSION_ID, 0) == 0
        assert await client.max_transaction_id(SESSION_ID, 3) == 0
        assert not results.done()
        disk.release.set()
        outcome = await results
        assert outcome[0] is None and outcome[2] is None and outcome[3] is None, outcome
        assert isinstance(outcome[1], StorageRpcError), outcome
        assert "Input/output error" in str(outcome[1])
        assert late_batches(node) == 1

    run_in_process(zookeeper, tmp_path, disk, slow=2, failing=1, scenario=scenario)


@pytest.mark.parametrize("threads", [0, MAX_CONNECTION_THREADS], ids=["loop", "connection-thread"])
def test_a_partition_alone_on_a_slow_disk_does_not_hold_the_next_pass(
    zookeeper: str, tmp_path: Path, threads: int
) -> None:
    """Partition 2's fsync hangs while it is alone in its pass (on the pass's own thread), or
    (issue 33) in a batch the data connection's thread runs itself; partition 0's requests that
    arrive on the same connection meanwhile are answered: the stuck pass, or the thread, is left
    behind after PASS_WAIT_MS."""
    disk = FaultyDisk()

    async def scenario(node: StorageNode, client: StorageClient, started: asyncio.Future[bool]) -> None:
        slow = asyncio.ensure_future(client.append(SESSION_ID, 2, make_records(0, 1, 2)))
        await started
        on_thread = node.metrics.counter("waltz-storage", "disk-connection-thread-batches").count
        assert on_thread == (1 if threads else 0)
        await client.append(SESSION_ID, 0, make_records(0, 1, 0))
        assert await client.max_transaction_id(SESSION_ID, 0) == 0
        assert not slow.done()
        disk.release.set()
        assert await slow is None
        assert await client.max_transaction_id(SESSION_ID, 2) == 0
        assert late_batches(node) == 1

    run_in_process(
        zookeeper, tmp_path, disk, slow=2, failing=None, scenario=scenario, max_connection_threads=threads
    )


@pytest.mark.parametrize("fault", ["write", "sync"])
def test_a_lone_append_failing_on_the_connection_thread_is_answered_and_cut_back(
    zookeeper: str, tmp_path: Path, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, fifth and sixth sessions: a lone APPEND that the data connection's thread runs
    itself in one call (``ConnectionThread._lone_append``, ``Segment.append_record``) and whose
    write or fdatasync fails is answered FAILURE and cut back; the same append then succeeds, and
    the next."""
    disk = FaultyDisk()

    async def scenario(node: StorageNode, client: StorageClient, started: asyncio.Future[bool]) -> None:
        assert node.manager is not None
        on_thread = node.metrics.counter("waltz-storage", "disk-connection-thread-batches")
        lone, general = _spy_on_paths(node, monkeypatch)
        await client.append(SESSION_ID, 0, make_records(0, 1, 0))
        faults = disk.failing_writes if fault == "write" else disk.failing
        faults.add(node.manager.partition(0).directory)
        with pytest.raises(StorageRpcError, match="Input/output error"):
            await client.append(SESSION_ID, 0, make_records(1, 1, 0))
        assert await client.max_transaction_id(SESSION_ID, 0) == 0
        faults.clear()
        await client.append(SESSION_ID, 0, make_records(1, 1, 0))
        await client.append(SESSION_ID, 0, make_records(2, 1, 0))
        assert await client.max_transaction_id(SESSION_ID, 0) == 2
        assert on_thread.count == 6  # (each request here, the reads too)
        assert (lone, general) == ([0, 0, 0, 0], [1, 1])  # (the appends in one call, the reads not)
        disk.slow_started.set()  # (partition 3, the slow one, is never written here)

    run_in_process(zookeeper, tmp_path, disk, slow=3, failing=None, scenario=scenario)


def _spy_on_paths(node: StorageNode, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """The partitions whose lone APPEND a connection thread took into its one call
    (``ConnectionThread._lone_append`` checks the partition's state), and the sizes of the
    batches it ran by the general path (``DiskPasses.run_claimed``), each noted before the
    request is answered."""
    passes = node.passes
    assert passes is not None
    lone: list[int] = []
    general: list[int] = []
    online_partition, run_claimed = connection_threads.online_partition, passes.run_claimed

    def spied_online_partition(worker: Any, session_id: int, offline: bool) -> Any:
        lone.append(worker.partition_id)
        return online_partition(worker, session_id, offline)

    def spied_run_claimed(worker: Any, batch: list[Any]) -> None:
        general.append(len(batch))
        run_claimed(worker, batch)

    monkeypatch.setattr(connection_threads, "online_partition", spied_online_partition)
    passes.run_claimed = spied_run_claimed  # type: ignore[method-assign]
    return lone, general


def test_the_lone_append_in_one_call_and_its_fallbacks(
    zookeeper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, sixth session: a read that is one APPEND of one record for an idle partition is
    served whole in one call of its connection thread; two frames in one read, and a request
    claimed that fails a check (a txid out of order, an old session), take the general path,
    with its answers; the log holds what the same requests give one by one."""
    disk = FaultyDisk()

    async def scenario(node: StorageNode, client: StorageClient, started: asyncio.Future[bool]) -> None:
        try:
            await requests(node, client)
        finally:
            disk.slow_started.set()  # (partition 3, the slow one, is never written here)

    async def requests(node: StorageNode, client: StorageClient) -> None:
        lone, general = _spy_on_paths(node, monkeypatch)
        passes_here = node.metrics.counter("waltz-storage", "disk-connection-thread-passes")
        await client.append(SESSION_ID, 0, make_records(0, 1, 0))
        assert (lone, general) == ([0], [])
        two = [lambda t=t: client.append(SESSION_ID, 0, make_records(t, 1, 0)) for t in (1, 2)]
        assert await corked(client, two) == [None, None]
        assert (lone, general, passes_here.count) == ([0], [], 1)  # (one pass, on the thread)
        with pytest.raises(StorageRpcError, match="transaction out of order"):
            await client.append(SESSION_ID, 0, make_records(5, 1, 0))
        with pytest.raises(StorageRpcError, match="session id has changed"):
            await client.append(SESSION_ID - 1, 0, make_records(3, 1, 0))
        assert (lone, general) == ([0, 0, 0], [1, 1])  # (each taken, then given to the general path)
        await client.append(SESSION_ID, 0, make_records(3, 1, 0))
        assert (lone, general) == ([0, 0, 0, 0], [1, 1])
        assert await client.records(SESSION_ID, 0, 0, 10) == make_records(0, 4, 0)

    run_in_process(zookeeper, tmp_path, disk, slow=3, failing=None, scenario=scenario)


def test_one_sync_for_a_pass_and_its_failure(zookeeper: str, tmp_path: Path) -> None:
    """Issue 33, ``storage.sync.scope`` file-system: a pass of three partitions is made durable by
    one whole-disk sync. When that sync fails, every partition of the pass fails with its error
    and is cut back; the same appends then succeed. A failing write fails only its partition."""
    disk = FaultyDisk()
    partitions = range(3)

    def shared_syncs(node: StorageNode) -> int:
        return node.metrics.counter("waltz-storage", "disk-pass-shared-syncs").count

    async def scenario(node: StorageNode, client: StorageClient, started: asyncio.Future[bool]) -> None:
        def appends(first: int) -> list[Callable[[], Awaitable[Any]]]:
            return [lambda p=p: client.append(SESSION_ID, p, make_records(first, 1, p)) for p in partitions]

        disk.failing_whole_syncs = 1
        failed = await corked(client, appends(0))
        assert all(isinstance(r, StorageRpcError) and "Input/output error" in str(r) for r in failed), failed
        assert [await client.max_transaction_id(SESSION_ID, p) for p in partitions] == [-1, -1, -1]
        assert shared_syncs(node) == 1
        assert await corked(client, appends(0)) == [None, None, None]
        assert shared_syncs(node) == 2
        assert node.manager is not None
        disk.failing_writes.add(node.manager.partition(1).directory)
        outcome = await corked(client, appends(1))
        assert outcome[0] is None and outcome[2] is None, outcome
        assert isinstance(outcome[1], StorageRpcError) and "Input/output error" in str(outcome[1])
        disk.failing_writes.clear()
        assert await client.append(SESSION_ID, 1, make_records(1, 1, 1)) is None
        for p in partitions:
            assert await client.records(SESSION_ID, p, 0, 10) == make_records(0, 2, p)
        assert "file-system" in node.sync_scope
        disk.slow_started.set()  # (partition 3, the slow one, is not written)

    run_in_process(
        zookeeper, tmp_path, disk, slow=3, failing=None, scenario=scenario, sync_scope=SYNC_SCOPE_FILE_SYSTEM
    )
