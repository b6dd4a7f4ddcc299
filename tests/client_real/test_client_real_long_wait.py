"""The partition's long-wait timer against real nodes (issue 22): after `waltz recover` fenced
the server's store session, the next append is decided "absent" by the server's new session,
but the server says so only when asked. The timer asks (a FlushRequest) once the append waited
several times the partition's recent commit latency, long before ``client.longWaitThreshold``,
and the retry commits.
"""

from __future__ import annotations

import asyncio
import time

from client_support.app import MockCallbacks, MockContext
from cluster_support import module_cluster, run_waltz_cli, waltz_client_config

from waltz_engine.client import WaltzClient
from waltz_engine.ops.devcluster import LocalCluster

PARTITION = 0
WARM_UP_TRANSACTIONS = 10
# The original's fixed nudge would wait this long; the timer must ask far sooner.
LONG_WAIT_CEILING_MS = 60_000
RESULT_WAIT_S = 50.0  # below the ceiling: an outcome in time proves the early flush
TEST_BOUND_S = 120.0

cluster = module_cluster(storages=1, partitions=1)


def test_an_append_after_recover_is_flushed_early_and_retried(cluster: LocalCluster) -> None:
    config = waltz_client_config(cluster, long_wait_threshold_ms=LONG_WAIT_CEILING_MS)
    measured: dict[str, float] = {}

    async def go() -> None:
        async with WaltzClient(MockCallbacks(), config) as client:
            warm_up = [MockContext(f"warm-up {i}", partition=PARTITION) for i in range(WARM_UP_TRANSACTIONS)]
            for context in warm_up:
                await client.submit(context)
            await client.flush()
            assert [await c.result(RESULT_WAIT_S) for c in warm_up] == [True] * WARM_UP_TRANSACTIONS
            recovered = await asyncio.to_thread(
                run_waltz_cli, "recover", "-p", str(PARTITION), "-c", str(cluster.client_config_path)
            )
            assert recovered.returncode == 0, recovered.stderr
            partition = client._stream_client().partition(PARTITION)
            flushes_before = partition.long_wait_flushes
            context = MockContext("after recover", partition=PARTITION)
            started = time.monotonic()
            await client.submit(context)
            assert await context.result(RESULT_WAIT_S) is True
            measured["append_after_recover_ms"] = (time.monotonic() - started) * 1000
            # The fenced attempt was proven absent by the flush the timer sent, then retried once.
            assert context.exec_count == 2
            assert partition.long_wait_flushes > flushes_before
            assert partition.monitor.latency.long_wait_ms() < LONG_WAIT_CEILING_MS

    asyncio.run(asyncio.wait_for(go(), TEST_BOUND_S))
    print(f"append after recover: {measured['append_after_recover_ms']:.0f} ms")
