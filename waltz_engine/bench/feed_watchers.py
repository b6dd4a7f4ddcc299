"""`waltz bench producers --watchers N`: N more stream connections fed every commit, in a process
of their own, that do what a Java client's network layer does and no more.

``--clients N`` measures the fan-out with N WaltzClients in the benchmark's one Python process,
so it measures our client library as much as the cluster: each client decodes every commit and
calls ``apply_transaction`` with a ``Transaction``. A watcher speaks the protocol as the original's
client does (TLS, Hello, MountRequest from the partition's current high-water mark, a
FeedRequest after READY and after every FeedSuspended) and only decodes the feed and counts it.
The server cannot tell it from a client; what the watchers cost the cluster is what N more
clients anywhere cost it, and the watchers' own process is reported apart (``watchers``).

The benchmark runs this module as ``python -m waltz_engine.bench.feed_watchers`` and writes the
spec (JSON, one line: it may hold key store passwords, so not on the command line) to its
standard input. The process prints ``READY`` once every watcher is mounted on every partition.
The next line it reads holds the high-water marks to wait for (JSON: partition -> txid); once
every watcher has been fed up to them, it prints the FeedData frames each partition delivered
in all and its own CPU seconds since READY (one JSON line: it is gone before the benchmark
could read them from /proc), and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from waltz_engine.bench.storage_node import BenchError
from waltz_engine.client.channel import FramedChannel
from waltz_engine.client.driver import open_framed_channel
from waltz_engine.common.reqid import ReqId
from waltz_engine.net.tls import TlsConfig, client_context
from waltz_engine.wire.client_messages import (
    PARTITION_STATE_READY,
    ClientMessage,
    FeedData,
    FeedRequest,
    FeedSuspended,
    MountRequest,
    MountResponse,
)

READY_LINE = "READY"
# Client ids far above the ones ZooKeeper hands out (a counter from 0): never a real client's.
FIRST_WATCHER_CLIENT_ID = 1 << 30
NETWORK_CLIENT_SEQ_NUM = 1
MOUNT_SEQ_NUM = 1
CONNECT_CONCURRENCY = 16
MOUNT_TIMEOUT_S = 60.0
# After the appends, every watcher is fed up to the last commit within this.
CATCH_UP_TIMEOUT_S = 60.0
CATCH_UP_POLL_S = 0.01


class WatchedPartition(NamedTuple):
    endpoint: str  # the server the partition is assigned to, as the client connects to it
    generation: int
    high_water_mark: int  # where the watchers mount (the feed starts after it)


@dataclass(frozen=True)
class WatchSpec:
    """How many watchers, each mounted on every partition here; TLS as the client config's."""

    watchers: int
    partitions: dict[int, WatchedPartition]
    tls: dict[str, Any] = field(default_factory=dict)  # TlsConfig's fields

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> WatchSpec:
        raw = json.loads(text)
        partitions = {
            int(p): WatchedPartition(str(e), int(g), int(h)) for p, (e, g, h) in raw["partitions"].items()
        }
        return WatchSpec(int(raw["watchers"]), partitions, raw.get("tls") or {})

    def endpoints(self) -> dict[str, list[int]]:
        by_endpoint: dict[str, list[int]] = {}
        for partition_id, partition in sorted(self.partitions.items()):
            by_endpoint.setdefault(partition.endpoint, []).append(partition_id)
        return by_endpoint


class _Watcher:
    """One connection to one server, mounted on its partitions; counts the FeedData it is fed."""

    def __init__(
        self, channel: FramedChannel, client_id: int, spec: WatchSpec, partition_ids: list[int]
    ) -> None:
        self.channel = channel
        self.sessions = {
            p: ReqId(client_id, spec.partitions[p].generation, p, MOUNT_SEQ_NUM) for p in partition_ids
        }
        self.high_water_marks = {p: spec.partitions[p].high_water_mark for p in partition_ids}
        self.frames = dict.fromkeys(partition_ids, 0)
        self.mounted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unmounted = set(partition_ids)

    async def run(self) -> None:
        self.channel.write(
            [
                MountRequest(req_id, self.high_water_marks[p], NETWORK_CLIENT_SEQ_NUM)
                for p, req_id in self.sessions.items()
            ]
        )
        while True:
            messages = await self.channel.receive_many()
            if messages is None:
                return
            answers: list[ClientMessage] = []
            for message in messages:
                if type(message) is FeedData:
                    partition_id = message.req_id.partition_id
                    if message.transaction_id == self.high_water_marks[partition_id] + 1:
                        self.high_water_marks[partition_id] = message.transaction_id
                        self.frames[partition_id] += 1
                elif isinstance(message, MountResponse):
                    if message.partition_state != PARTITION_STATE_READY:
                        raise RuntimeError(f"mount of {message.req_id} answered {message.partition_state}")
                    partition_id = message.req_id.partition_id
                    answers.append(FeedRequest(message.req_id, self.high_water_marks[partition_id]))
                    self._unmounted.discard(partition_id)
                    if not self._unmounted and not self.mounted.done():
                        self.mounted.set_result(None)
                elif isinstance(message, FeedSuspended):
                    partition_id = message.req_id.partition_id
                    answers.append(FeedRequest(message.req_id, self.high_water_marks[partition_id]))
            if answers:
                self.channel.write(answers)


class WatchResult(NamedTuple):
    frames: dict[int, int]  # FeedData frames per partition, all watchers'
    cpu_s: float  # this process's CPU seconds from READY until every watcher was fed to the end


async def watch(spec: WatchSpec, targets: asyncio.Future[dict[int, int]]) -> WatchResult:
    """Mount ``spec.watchers`` connections, say READY, feed them until each is fed up to the
    high-water marks ``targets`` brings."""
    context = client_context(TlsConfig(**spec.tls))
    has_certificate = spec.tls.get("key_store_location") is not None
    slots = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect(endpoint: str) -> FramedChannel:
        async with slots:
            return await open_framed_channel(endpoint, context, has_certificate)

    endpoints = spec.endpoints()
    places = [(i, endpoint) for i in range(spec.watchers) for endpoint in endpoints]
    channels = await asyncio.gather(*(connect(endpoint) for _, endpoint in places))
    watchers = [
        _Watcher(channel, FIRST_WATCHER_CLIENT_ID + i, spec, endpoints[endpoint])
        for (i, endpoint), channel in zip(places, channels, strict=True)
    ]
    tasks = [asyncio.create_task(w.run()) for w in watchers]
    try:
        async with asyncio.timeout(MOUNT_TIMEOUT_S):
            await asyncio.gather(*(w.mounted for w in watchers))
        print(READY_LINE, flush=True)
        ready_cpu_s = time.process_time()
        wanted = await targets
        deadline = asyncio.get_running_loop().time() + CATCH_UP_TIMEOUT_S
        while any(w.high_water_marks[p] < wanted.get(p, -1) for w in watchers for p in w.high_water_marks):
            failed = [task for task in tasks if task.done()]
            if failed:
                failed[0].result()  # its error, or the connection's end
                raise RuntimeError("a watcher's connection ended before it was fed up to the end")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(
                    f"not every watcher was fed up to the last commit within {CATCH_UP_TIMEOUT_S:.0f} s"
                )
            await asyncio.sleep(CATCH_UP_POLL_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)
    frames = {p: sum(w.frames.get(p, 0) for w in watchers) for p in spec.partitions}
    return WatchResult(frames, time.process_time() - ready_cpu_s)


async def _main(spec: WatchSpec) -> WatchResult:
    loop = asyncio.get_running_loop()
    targets: asyncio.Future[dict[int, int]] = loop.create_future()

    def arrived(line: str) -> None:
        if not targets.done():
            targets.set_result({int(p): int(hwm) for p, hwm in json.loads(line or "{}").items()})

    # The benchmark writes the targets when it has measured: wait for them off the loop.
    loop.run_in_executor(None, sys.stdin.readline).add_done_callback(
        lambda future: loop.call_soon_threadsafe(arrived, future.result())
    )
    return await watch(spec, targets)


def main() -> None:
    try:
        spec = WatchSpec.from_json(sys.stdin.readline())
        result = asyncio.run(_main(spec))
    except Exception as e:  # the benchmark reports the exit; one line says why
        print(f"feed watchers: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result._asdict()), flush=True)


if __name__ == "__main__":
    main()


# --- the benchmark's side -------------------------------------------------------------------------


class WatcherProcess:
    """The watchers' process, seen from the benchmark: start it, wait for READY, then finish it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    @staticmethod
    async def start(spec: WatchSpec) -> WatcherProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        watchers = WatcherProcess(process)
        try:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(spec.to_json().encode() + b"\n")
            await process.stdin.drain()
            async with asyncio.timeout(MOUNT_TIMEOUT_S * 2):
                line = await process.stdout.readline()
            if line.decode().strip() != READY_LINE:
                raise BenchError(f"the feed watchers did not mount (exit {await process.wait()})")
        except BaseException:
            await watchers.close()
            raise
        return watchers

    async def finish(self, high_water_marks: dict[int, int]) -> WatchResult:
        """What the watchers did, once every one was fed up to ``high_water_marks``."""
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(high_water_marks).encode() + b"\n")
        await process.stdin.drain()
        async with asyncio.timeout(CATCH_UP_TIMEOUT_S * 2):
            line = await process.stdout.readline()
        if await process.wait() != 0 or not line:
            raise BenchError(f"the feed watchers failed (exit {process.returncode}; their error is above)")
        raw = json.loads(line)
        return WatchResult({int(p): int(n) for p, n in raw["frames"].items()}, float(raw["cpu_s"]))

    async def close(self) -> None:
        if self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
